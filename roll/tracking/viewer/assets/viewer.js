// The roll trajectory viewer: pages chosen by the location hash, data from data/run.js and one script per dump.
//   #/                          overview: run health, chart, dashboard, metrics per step
//   #/steps                     the dumped steps
//   #/step/<phase>/<step>       a step's trajectories by env group (filter, sort)
//   #/traj/<phase>/<step>/<id>  one trajectory, turn by turn, reply tokens colored by advantage
//   #/val                       validation outcomes per room (rows) and step (columns)
//   #/case/<case>               one room (prompt) across validation steps, side by side
"use strict";

const RUN = window.ROLL_RUN || {dumps: [], steps: [], columns: [], charts: [], notes: [], envs: {},
                                health: {checked: false, note: null, events: []}};
const el = R.el;
const app = document.getElementById("app");
const ui = {outcome: "all", tag: "", sort: "group", mode: "adv", chart: 0, valSort: "room"};

// ------------------------------------------------------------------------------------------------- data
const loading = {};

/** The records of dump ``phase``/``step``, loading its script on first use. */
function loadDump(phase, step) {
  const key = `${phase}/${step}`;
  const dumps = window.ROLL_DUMPS || {};
  if (dumps[key]) return Promise.resolve(dumps[key]);
  const info = RUN.dumps.find((d) => d.phase === phase && d.step === step);
  if (!info) return Promise.reject(new Error(`no ${phase} dump at step ${step}`));
  loading[key] = loading[key] || new Promise((resolve, reject) => {
    const script = el("script", {src: info.file});
    script.onload = () => resolve(window.ROLL_DUMPS[key]);
    script.onerror = () => reject(new Error(`could not load ${info.file}`));
    document.head.append(script);
  });
  return loading[key];
}

function dumpsOf(phase) { return RUN.dumps.filter((d) => d.phase === phase); }
function symbolsOf(tag) { return (RUN.envs[tag] || {}).grid_symbols || null; }
// the import path of the agent harness that plays ``tag`` through the gateway, or null for an env tag
function harnessOf(tag) { return (RUN.envs[tag] || {}).agent_runner || null; }
function stepLink(phase, step) { return `#/step/${phase}/${step}`; }
function trajLink(phase, step, id) { return `#/traj/${phase}/${step}/${encodeURIComponent(id)}`; }

// ------------------------------------------------------------------------------------------------- widgets
function crumbs(...parts) {
  return el("div", {class: "crumbs"}, parts.map((p, i) => [i ? " › " : "",
    Array.isArray(p) ? el("a", {href: p[1]}, p[0]) : el("span", {}, p)]));
}

function outcomeBadge(r) {
  if (r.failure) return el("span", {class: "badge fail", title: r.failure}, harnessOf(r.tag) ? "harness error" : "env error");
  return r.success ? el("span", {class: "badge ok"}, "✓ success") : el("span", {class: "badge no"}, "✗ failure");
}

function segmented(name, options, value, onChange) {
  return el("div", {class: "segmented", role: "group", "aria-label": name},
    options.map(([v, label]) => el("button", {class: v === value ? "on" : "", dataset: {value: v},
                                              onclick: () => onChange(v)}, label)));
}

function actionsText(r) {
  return r.turns.map((t) => t.action === null ? "∅" : (t.valid ? t.action : `✗${t.action}`)).join(" ");
}

function mean(xs) { return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null; }

// ------------------------------------------------------------------------------------------------- overview
function overview() {
  const info = el("p", {class: "muted"}, `${RUN.pipeline} run · ${RUN.source} · ${RUN.steps.length} logged steps · `,
                  `${dumpsOf("train").length} training and ${dumpsOf("val").length} validation dumps`);
  const top = el("div", {class: "overview-top"});
  if (RUN.charts.length) {
    const holder = el("div", {class: "chart-holder"});
    const draw = () => {
      const chart = RUN.charts[ui.chart];
      holder.replaceChildren(R.chart(chart, (step) => {
        const dump = RUN.dumps.find((d) => d.step === step && d.phase === "train")
                     || RUN.dumps.find((d) => d.step === step);
        if (dump) location.hash = stepLink(dump.phase, dump.step);
      }, 560, 200), R.chartLegend(chart));
    };
    const pick = el("select", {id: "chart-pick", onchange: (e) => { ui.chart = Number(e.target.value); draw(); }},
                    RUN.charts.map((c, i) => el("option", {value: i, selected: i === ui.chart ? "" : null}, c.title)));
    draw();
    top.append(el("section", {class: "card"}, el("h2", {}, "Over steps ", pick), holder));
  }
  top.append(el("section", {class: "card"}, el("h2", {}, "Rollouts"), el("div", {class: "scroll"}, dumpsTable())));
  const parts = [el("h1", {}, RUN.title), info, healthCard(), top,
                 el("section", {class: "card"}, el("h2", {}, "Metrics per step"), stepsTable())];
  if (RUN.dashboard) {
    parts.push(el("section", {class: "card"}, el("h2", {}, "Dashboard ", el("span", {class: "muted"}, "(metrics.png)")),
      el("img", {id: "dashboard", src: RUN.dashboard, alt: "metrics dashboard (the run's metrics.png)"}),
      RUN.notes.length ? el("p", {class: "muted"}, "constant, not drawn: " + RUN.notes.join(", ")) : null));
  }
  return parts;
}

/** The run-health summary and its events (health.jsonl), or null for a run without the health check. */
function healthCard() {
  const health = RUN.health || {checked: false, events: []};
  if (!health.checked) return null;
  const fired = health.events.some((e) => e.event === "fired");
  const note = el("p", {id: "health-note", class: "health-note " + (fired ? "alert" : "ok")},
                  health.note || "run health: no rule left its healthy range");
  if (!health.events.length) return el("section", {class: "card", id: "health"}, el("h2", {}, "Run health"), note);
  const rows = health.events.map((e) => el("tr", {class: e.event, dataset: {rule: e.rule, step: e.step}},
    el("td", {class: "num"}, e.step), el("td", {}, e.rule), el("td", {}, e.event),
    el("td", {}, e.line.replace(/^\[roll\] health: step \d+: /, ""))));
  return el("section", {class: "card", id: "health"}, el("h2", {}, "Run health"), note,
    el("div", {class: "scroll"}, el("table", {id: "health-events", class: "grid-table"},
      el("thead", {}, el("tr", {}, ["step", "rule", "event", "what and what to do"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows))));
}

function stepsTable() {
  if (!RUN.steps.length) return el("p", {class: "muted"}, "No metrics.jsonl in this run.");
  const head = el("tr", {}, el("th", {}, "step"), RUN.columns.map((c) => el("th", {title: c.key}, c.label)),
                  el("th", {}, "rollouts"));
  const rows = RUN.steps.map((s) => {
    const links = RUN.dumps.filter((d) => d.step === s.step)
      .map((d) => el("a", {href: stepLink(d.phase, d.step), class: "pill"}, d.phase));
    return el("tr", {class: links.length ? "has-dump" : ""}, el("td", {}, s.step),
              RUN.columns.map((c) => el("td", {class: "num"}, R.fmt(s.values[c.key], c.percent))), el("td", {}, links));
  });
  return el("div", {class: "scroll"}, el("table", {id: "steps-table", class: "grid-table"}, el("thead", {}, head),
                                         el("tbody", {}, rows)));
}

function dumpsTable() {
  if (!RUN.dumps.length) {
    return el("p", {class: "muted"},
              "This run has no dumps: set trajectory_dump_steps (agentic) or rollout_dump_steps (RLVR).");
  }
  const open = (d) => () => { location.hash = stepLink(d.phase, d.step); };
  const rows = RUN.dumps.map((d) => el("tr", {class: "clickable", onclick: open(d)},
    el("td", {}, el("a", {href: stepLink(d.phase, d.step)}, `${d.phase} step ${d.step}`)),
    [d.count, d.groups, R.fmt(d.success, true), R.fmt(d.score)].map((v) => el("td", {class: "num"}, v))));
  return el("table", {class: "grid-table dumps-table"}, el("thead", {}, el("tr", {},
    ["dump", "trajectories", "groups", "success", "mean score"].map((h) => el("th", {}, h)))), el("tbody", {}, rows));
}

function stepsPage() {
  return [crumbs(["Overview", "#/"], "Rollouts"), el("h1", {}, "Dumped rollouts"), dumpsTable()];
}

// ------------------------------------------------------------------------------------------------- a step
function groupsOf(records) {
  const groups = new Map();
  for (const r of records) {
    if (!groups.has(r.group)) groups.set(r.group, []);
    groups.get(r.group).push(r);
  }
  return [...groups.entries()].map(([id, members]) => ({id, members}));
}

function visible(records) {
  const outcome = {all: () => true, success: (r) => !!r.success, failure: (r) => !r.success, error: (r) => !!r.failure};
  return records.filter((r) => outcome[ui.outcome](r) && (!ui.tag || r.tag === ui.tag));
}

function sortRecords(members) {
  if (ui.sort === "score-desc") return [...members].sort((a, b) => b.score - a.score);
  if (ui.sort === "score-asc") return [...members].sort((a, b) => a.score - b.score);
  return members;
}

function groupCard(phase, step, group) {
  const first = group.members[0];
  const start = first.turns.length ? first.turns[0] : null;
  const solved = group.members.filter((r) => r.success).length;
  const head = el("div", {class: "group-head"},
    start ? R.frames(start, "sm") : null,
    start && start.observation !== null ? R.board(start.observation, symbolsOf(first.tag), "sm") : null,
    el("div", {}, el("h3", {}, `group ${group.id}`),
      el("p", {class: "muted"}, `${first.tag} · ${first.case} · ${solved}/${group.members.length} succeeded · `,
         `mean score ${R.fmt(mean(group.members.map((r) => r.score)))}`),
      first.ground_truth !== undefined ? el("p", {}, "answer: ", el("code", {}, first.ground_truth)) : null,
      start && start.observation === null ? el("pre", {class: "prompt-preview"}, start.prompt.slice(-400)) : null));
  const rows = sortRecords(group.members).map((r) => el("tr", {class: "traj-row clickable", dataset: {id: r.id},
    onclick: () => { location.hash = trajLink(phase, step, r.id); }},
    el("td", {}, outcomeBadge(r)), el("td", {}, el("a", {href: trajLink(phase, step, r.id)}, r.id)),
    el("td", {class: "num"}, R.fmt(r.score)), el("td", {class: "num"}, r.turns.length),
    el("td", {class: "actions"}, r.turns[0] && r.turns[0].observation === null ? r.turns[0].response.slice(0, 80)
                                                                             : actionsText(r))));
  return el("section", {class: "card group", dataset: {group: group.id}}, head,
    el("table", {class: "grid-table trajs"}, el("thead", {}, el("tr", {},
      ["outcome", "trajectory", "score", "turns", "actions"].map((h) => el("th", {}, h)))), el("tbody", {}, rows)));
}

function stepPage(phase, step, records) {
  const tags = [...new Set(records.map((r) => r.tag))];
  const shown = visible(records);
  let groups = groupsOf(shown);
  if (ui.sort !== "group") {
    const sign = ui.sort === "score-desc" ? -1 : 1;
    groups = groups.sort((a, b) => sign * (mean(a.members.map((r) => r.score)) - mean(b.members.map((r) => r.score))));
  }
  const same = dumpsOf(phase);
  const at = same.findIndex((d) => d.step === step);
  const nav = el("span", {class: "pager"},
    at > 0 ? el("a", {href: stepLink(phase, same[at - 1].step)}, `‹ step ${same[at - 1].step}`) : null,
    at < same.length - 1 ? el("a", {href: stepLink(phase, same[at + 1].step)}, `step ${same[at + 1].step} ›`) : null);
  const rerender = () => render();
  const controls = el("div", {class: "controls"},
    segmented("outcome", [["all", "All"], ["success", "Success"], ["failure", "Failure"],
                          ["error", `Error (${records.filter((r) => r.failure).length})`]], ui.outcome,
              (v) => { ui.outcome = v; rerender(); }),
    tags.length > 1 ? el("select", {id: "tag-pick", onchange: (e) => { ui.tag = e.target.value; rerender(); }},
      el("option", {value: ""}, "all tags"),
      tags.map((t) => el("option", {value: t, selected: t === ui.tag ? "" : null}, t)))
      : null,
    el("label", {}, "sort ", el("select", {id: "sort-pick", onchange: (e) => { ui.sort = e.target.value; rerender(); }},
      [["group", "group order"], ["score-desc", "score: high to low"], ["score-asc", "score: low to high"]]
        .map(([v, label]) => el("option", {value: v, selected: v === ui.sort ? "" : null}, label)))));
  const summary = el("p", {id: "step-summary"},
    `${records.length} ${phase === "val" ? "validation " : ""}trajectories in `,
    `${groupsOf(records).length} groups · success ${R.fmt(mean(records.map((r) => (r.success ? 1 : 0))), true)} · `,
    `mean score ${R.fmt(mean(records.map((r) => r.score)))} · showing ${shown.length}`);
  return [crumbs(["Overview", "#/"], ["Rollouts", "#/steps"], `${phase} step ${step}`),
    el("h1", {}, `${phase === "val" ? "Validation" : "Training"} rollouts, step ${step} `, nav), summary, controls,
    el("div", {id: "groups"}, groups.map((g) => groupCard(phase, step, g)))];
}

// ------------------------------------------------------------------------------------------------- router
async function render() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const tab = {"": "overview", steps: "steps", step: "steps", traj: "steps", val: "val", "case": "val"}[parts[0]];
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.tab === tab));
  try {
    let page;
    if (parts[0] === "steps") page = stepsPage();
    else if (parts[0] === "step") {
      page = stepPage(parts[1], Number(parts[2]), await loadDump(parts[1], Number(parts[2])));
    }
    else if (parts[0] === "traj") {
      const records = await loadDump(parts[1], Number(parts[2]));
      page = V.trajectoryPage(parts[1], Number(parts[2]), records, parts.slice(3).join("/"));
    } else if (parts[0] === "val") page = await V.validationPage();
    else if (parts[0] === "case") page = await V.casePage(parts.slice(1).join("/"));
    else page = overview();
    app.replaceChildren(...[page].flat(Infinity).filter((node) => node !== null && node !== undefined));
  } catch (err) {
    app.replaceChildren(el("p", {class: "error"}, String(err.message || err)),
                        el("a", {href: "#/"}, "back to the overview"));
  }
}

// shared with trajectory.js
window.V = Object.assign(window.V || {}, {RUN, ui, loadDump, dumpsOf, symbolsOf, harnessOf, stepLink, trajLink, crumbs,
                                          outcomeBadge, segmented, mean, render});
document.getElementById("run-title").textContent = RUN.title || "";
document.title = `${RUN.title || "run"} · roll view`;
window.addEventListener("hashchange", () => { render(); window.scrollTo(0, 0); });
window.addEventListener("DOMContentLoaded", render);
