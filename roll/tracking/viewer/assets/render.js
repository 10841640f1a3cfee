// Building blocks of the roll viewer: DOM helpers, boards drawn from text grids, reply tokens colored by
// advantage or probability, and a small SVG line chart. No dependencies; every text goes in through textContent.
"use strict";

const R = {};

/** el("div", {class: "x", text: "hi", onclick: f}, child, ...) -> an element (children: nodes, strings, null). */
R.el = function (tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
};

R.fmt = function (value, percent) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (percent) return (100 * value).toFixed(1) + "%";
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) return value.toExponential(2);
  return Number(value.toPrecision(4)).toString();
};

// ------------------------------------------------------------------------------------------------- frames
/** The frames the model saw in a turn (vision-language envs): an <img> per kept frame, a note per dropped one. */
R.frames = function (turn, size) {
  const el = R.el;
  if (!turn.frames || !turn.frames.length) return null;
  return el("div", {class: "frames" + (size ? " frames-" + size : "")}, turn.frames.map((f, i) => (f.src
    ? el("img", {class: "frame", src: f.src, width: f.width, height: f.height, alt: `frame ${i + 1} the model saw`,
                 title: `${f.width}×${f.height}` + (f.source_size ? ` (downscaled from ${f.source_size.join("×")})` : "")})
    : el("p", {class: "frame-dropped muted"}, `frame ${i + 1} not kept: ${f.dropped}`))));
};

// ------------------------------------------------------------------------------------------------- boards
// Cell styles by the symbol's name (TextEnv.grid_symbols); names not listed get a color from their hash.
const CELL_STYLES = {
  "wall": {bg: "#4a4a4a"},
  "floor": {bg: "#f3efe4"},
  "target": {bg: "#f3efe4", glyph: "◎", fg: "#c0392b"},
  "box": {bg: "#f3efe4", glyph: "■", fg: "#b7793a"},
  "box on target": {bg: "#f3efe4", glyph: "■", fg: "#27ae60"},
  "player": {bg: "#f3efe4", glyph: "●", fg: "#2563eb"},
  "player on target": {bg: "#f8d7d3", glyph: "●", fg: "#2563eb"},
  "frozen ice": {bg: "#dcecfb"},
  "hole": {bg: "#1e3a5f"},
  "goal": {bg: "#ffd166", glyph: "★", fg: "#8a6d00"},
  "player fallen into a hole": {bg: "#1e3a5f", glyph: "✖", fg: "#ff6b6b"},
  "player on the goal": {bg: "#ffd166", glyph: "●", fg: "#2563eb"},
};

function hashHue(text) {
  let h = 0;
  for (const ch of text) h = (h * 31 + ch.charCodeAt(0)) % 360;
  return h;
}

R.cellStyle = function (name) {
  return CELL_STYLES[name] || {bg: `hsl(${hashHue(name)}, 60%, 80%)`, glyph: name.slice(0, 1)};
};

/** The rows of ``text`` when it is a grid of ``symbols`` (all rows equally long, every char a symbol), else null. */
R.gridRows = function (text, symbols) {
  if (!symbols || typeof text !== "string") return null;
  const rows = text.replace(/\s+$/, "").split("\n");
  if (rows.length < 2 || rows.some((r) => r.length !== rows[0].length || r.length < 2)) return null;
  return rows.every((r) => [...r].every((ch) => ch in symbols)) ? rows : null;
};

/** A board element of an observation, or a <pre> with its text when it is not a grid. */
R.board = function (text, symbols, size) {
  const rows = R.gridRows(text, symbols);
  if (!rows) return R.el("pre", {class: "obs-text", text: text === null ? "" : text});
  const grid = R.el("div", {class: "board" + (size ? " board-" + size : ""), role: "img",
                            "aria-label": rows.join(" / "), title: rows.join("\n")});
  grid.style.gridTemplateColumns = `repeat(${rows[0].length}, var(--cell))`;
  for (const row of rows) {
    for (const ch of row) {
      const style = R.cellStyle(symbols[ch]);
      const cell = R.el("span", {class: "cell", title: `${ch}: ${symbols[ch]}`, dataset: {symbol: ch}},
                        style.glyph || "");
      cell.style.background = style.bg;
      if (style.fg) cell.style.color = style.fg;
      grid.append(cell);
    }
  }
  return grid;
};

/** A legend of the symbols that appear in ``texts``. */
R.boardLegend = function (texts, symbols) {
  const seen = new Set();
  for (const t of texts) for (const ch of R.gridRows(t, symbols) ? t : "") if (ch in symbols) seen.add(ch);
  if (!seen.size) return null;
  return R.el("div", {class: "legend board-legend"}, [...seen].sort().map((ch) => {
    const style = R.cellStyle(symbols[ch]);
    const swatch = R.el("span", {class: "cell"}, style.glyph || "");
    swatch.style.background = style.bg;
    if (style.fg) swatch.style.color = style.fg;
    return R.el("span", {class: "legend-item"}, swatch, ` ${ch} ${symbols[ch]}`);
  }));
};

// ------------------------------------------------------------------------------------------------- tokens
/** Background color of a token: advantage (blue positive, red negative, scaled by ``scale``) or probability. */
R.tokenColor = function (mode, adv, logp, scale) {
  if (mode === "adv" && adv !== undefined) {
    const a = Math.max(-1, Math.min(1, adv / (scale || 1)));
    return a >= 0 ? `rgba(37, 99, 235, ${0.08 + 0.62 * a})` : `rgba(220, 38, 38, ${0.08 + 0.62 * -a})`;
  }
  if (mode === "prob" && logp !== undefined) {
    return `rgba(234, 140, 0, ${0.75 * (1 - Math.exp(logp))})`;
  }
  return "transparent";
};

/** The reply's tokens as spans: colored per ``mode``, masked-out tokens struck through; tooltips give values. */
R.tokens = function (turn, mode, scale) {
  const box = R.el("div", {class: "tokens"});
  (turn.tokens || []).forEach((tok, j) => {
    const adv = turn.adv ? turn.adv[j] ?? undefined : undefined;  // null: a non-finite value in the dump
    const logp = turn.logp ? turn.logp[j] ?? undefined : undefined;
    const masked = turn.mask && turn.mask[j] === 0;
    const tips = [`token ${j}: ${JSON.stringify(tok)}`];
    if (adv !== undefined) tips.push(`advantage ${adv}`);
    if (logp !== undefined) tips.push(`log-prob ${logp} (p = ${Math.exp(logp).toFixed(3)})`);
    tips.push(masked ? "mask 0: not trained on" : "mask 1: trained on");
    const shown = tok.replace(/\n/g, "↵\n").replace(/\t/g, "→");
    const span = R.el("span", {class: "tok" + (masked ? " masked" : "") + (/^<\|.*\|>$/.test(tok) ? " special" : ""),
                               title: tips.join("\n"), dataset: {adv: adv, mask: masked ? 0 : 1}}, shown);
    span.style.background = R.tokenColor(mode, adv, logp, scale);
    box.append(span);
  });
  return box;
};

/** The largest |advantage| over ``records`` (the color scale of a step), 1 when there is none. */
R.advScale = function (records) {
  let m = 0;
  for (const r of records) for (const t of r.turns) for (const a of t.adv || []) m = Math.max(m, Math.abs(a));
  return m || 1;
};

// ------------------------------------------------------------------------------------------------- chart
/** An SVG line chart of ``chart`` ({train, smooth, val: [[step, value]], percent, refs: [{label, value}],
 *  alerts: [[step, [rule]]]}): refs are dashed levels with their label, alerts triangles on the step axis;
 *  ``onPick(step)`` on a click on a point or an alert. */
R.chart = function (chart, onPick, width, height) {
  const W = width || 640, H = height || 220, P = {l: 52, r: 12, t: 12, b: 28};
  const refs = chart.refs || [];
  const all = [...(chart.train || []), ...(chart.val || []), ...refs.map((r) => [null, r.value])];
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("class", "chart");
  if (!all.length) return svg;
  const xs = all.filter((p) => p[0] !== null).map((p) => p[0]), ys = all.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.08;
  y0 -= pad; y1 += pad;
  const X = (x) => P.l + (x - x0) / (x1 - x0) * (W - P.l - P.r);
  const Y = (y) => H - P.b - (y - y0) / (y1 - y0) * (H - P.t - P.b);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4;
    add("line", {x1: P.l, x2: W - P.r, y1: Y(y), y2: Y(y), class: "grid"});
    add("text", {x: P.l - 6, y: Y(y) + 4, "text-anchor": "end", class: "tick"}, R.fmt(y, chart.percent));
  }
  for (let i = 0; i <= 5; i++) {
    const x = Math.round(x0 + (x1 - x0) * i / 5);
    add("text", {x: X(x), y: H - 8, "text-anchor": "middle", class: "tick"}, String(x));
  }
  const line = (points, cls) => add("polyline", {class: cls,
                                                  points: points.map((p) => `${X(p[0])},${Y(p[1])}`).join(" ")});
  if (chart.train) line(chart.train, chart.smooth ? "train faint" : "train");
  if (chart.smooth) line(chart.smooth, "train");
  if (chart.val) line(chart.val, "val");
  refs.forEach((ref, i) => {
    const level = add("line", {x1: P.l, x2: W - P.r, y1: Y(ref.value), y2: Y(ref.value), class: `ref ref-${i}`});
    const tip = document.createElementNS(ns, "title");
    tip.textContent = `${ref.label}: ${R.fmt(ref.value, chart.percent)}`;
    level.append(tip);
  });
  for (const [x, rules] of chart.alerts || []) {
    if (x < x0 || x > x1) continue;
    const y = H - P.b;
    const mark = add("polygon", {class: "alert", points: `${X(x)},${y - 7} ${X(x) - 4},${y} ${X(x) + 4},${y}`,
                                 "data-step": x});
    const tip = document.createElementNS(ns, "title");
    tip.textContent = `step ${x}: health alert (${rules.join(", ")})`;
    mark.append(tip);
    if (onPick) mark.addEventListener("click", () => onPick(x));
  }
  for (const [cls, points] of [["train", chart.smooth ? [] : chart.train || []], ["val", chart.val || []]]) {
    for (const [x, y] of points) {
      const dot = add("circle", {cx: X(x), cy: Y(y), r: cls === "val" ? 4 : 2.5, class: "dot " + cls});
      const tip = document.createElementNS(ns, "title");
      tip.textContent = `step ${x}: ${R.fmt(y, chart.percent)} (${cls === "val" ? "validation" : "training"})`;
      dot.append(tip);
      if (onPick) dot.addEventListener("click", () => onPick(x));
    }
  }
  return svg;
};

/** The legend of ``chart``: its series, the levels to beat with their values, and the alert marker if any. */
R.chartLegend = function (chart) {
  const items = [R.el("span", {class: "key train"}, "training")];
  if (chart.val) items.push(R.el("span", {class: "key val"}, "validation"));
  (chart.refs || []).forEach((ref, i) => items.push(
    R.el("span", {class: `key ref ref-${i}`}, `${ref.label}: ${R.fmt(ref.value, chart.percent)}`)));
  if ((chart.alerts || []).length) items.push(R.el("span", {class: "key alert"}, "health alert"));
  return R.el("p", {class: "legend chart-legend"}, items, "click a point to open that step's rollouts");
};

window.R = R;
