// Pages of the roll viewer that show trajectories: one trajectory turn by turn, validation outcomes per room and
// step, and one room across validation steps. Helpers (V.*) come from viewer.js, building blocks (R.*) from render.js.
"use strict";

window.V = window.V || {};

function modeLegend(mode, hasAdv, scale) {
  const el = R.el;
  if (mode === "adv" && hasAdv) {
    return el("p", {class: "legend"}, "token background: advantage, ",
      el("span", {class: "tok", style: `background:${R.tokenColor("adv", -scale, 0, scale)}`}, R.fmt(-scale)), " … ",
      el("span", {class: "tok", style: `background:${R.tokenColor("adv", 0, 0, scale)}`}, "0"), " … ",
      el("span", {class: "tok", style: `background:${R.tokenColor("adv", scale, 0, scale)}`}, "+" + R.fmt(scale)),
      " (scale: the step's largest |advantage|) · ", el("span", {class: "tok masked"}, "struck"),
      " tokens have mask 0 (not trained on) · hover a token for its values");
  }
  if (mode === "prob") {
    return el("p", {class: "legend"}, "token background: how unlikely the sampled token was (1 − p); ",
      el("span", {class: "tok masked"}, "struck"), " tokens have mask 0 (not trained on)");
  }
  return el("p", {class: "legend"}, el("span", {class: "tok masked"}, "struck"),
            " tokens have mask 0 (not trained on)");
}

function frameNote(record) {
  const c = record.frame_counts;
  if (!c) return null;
  return R.el("p", {id: "frame-note", class: "muted"}, `frames: ${c.kept} of ${c.seen} kept`,
              c.downscaled ? `, ${c.downscaled} downscaled` : "", c.dropped ? `, ${c.dropped} dropped` : "",
              c.downscaled || c.dropped ? " (bounds: trajectory_dump_frames, trajectory_dump_frame_kib)" : "");
}

function turnCard(record, turn, k, scale) {
  const el = R.el;
  const facts = el("div", {class: "facts"}, el("b", {}, `Turn ${k + 1}`),
    turn.action !== null ? el("span", {}, "action ", el("code", {class: "action"}, turn.action)) : null,
    turn.valid ? el("span", {class: "badge ok"}, "valid") : el("span", {class: "badge no"}, "invalid"),
    el("span", {}, "reward ", el("b", {class: "reward"}, R.fmt(turn.reward))),
    turn.finish !== "stop"
      ? el("span", {class: "badge warn", title: "generation stopped at max tokens"}, "cut by length") : null,
    turn.adv && turn.adv.length ? el("span", {class: "muted"}, `advantage ${R.fmt(turn.adv[0])}`) : null);
  return el("section", {class: "card turn", dataset: {turn: k}},
    turn.observation !== null || turn.frames
      ? el("div", {class: "observation"}, R.frames(turn),
           turn.observation !== null ? R.board(turn.observation, V.symbolsOf(record.tag)) : null)
      : null,
    el("div", {class: "reply"}, facts, R.tokens(turn, V.ui.mode, scale),
      el("details", {class: "prompt", open: turn.observation === null ? "" : null},
         el("summary", {}, k === 0 ? "prompt: the exact text the model saw" : "text appended before this reply"),
         el("pre", {}, turn.prompt))));
}

V.trajectoryPage = function (phase, step, records, id) {
  const el = R.el;
  const record = records.find((r) => r.id === id);
  if (!record) throw new Error(`no trajectory ${id} in ${phase} step ${step}`);
  const members = records.filter((r) => r.group === record.group);
  const at = members.indexOf(record);
  const hasAdv = record.turns.some((t) => t.adv);
  if (!hasAdv && V.ui.mode === "adv") V.ui.mode = "prob";
  const scale = R.advScale(records);
  const nav = el("span", {class: "pager"},
    at > 0 ? el("a", {href: V.trajLink(phase, step, members[at - 1].id)}, "‹ previous in group") : null,
    at < members.length - 1 ? el("a", {href: V.trajLink(phase, step, members[at + 1].id)}, "next in group ›") : null);
  const metrics = Object.entries(record.metrics || {}).map(([k, v]) => `${k} ${R.fmt(v)}`).join(" · ");
  const modes = [["adv", "advantage"], ["prob", "probability"], ["none", "plain"]]
    .filter(([m]) => m !== "adv" || hasAdv);
  const symbols = V.symbolsOf(record.tag);
  return [V.crumbs(["Overview", "#/"], ["Rollouts", "#/steps"], [`${phase} step ${step}`, V.stepLink(phase, step)],
                   record.id),
    el("h1", {}, "Trajectory ", el("code", {}, record.id), " ", nav),
    el("p", {id: "traj-summary"}, V.outcomeBadge(record),
       ` score ${R.fmt(record.score)} · ${record.turns.length} turn${record.turns.length === 1 ? "" : "s"} · `,
       `${record.tag} · group ${record.group} · ${record.case}`, record.truncated ? " · cut by sequence length" : "",
       V.harnessOf(record.tag) ? el("span", {class: "badge harness", title: V.harnessOf(record.tag)},
                                    `agent harness ${V.harnessOf(record.tag)}`) : "",
       record.ground_truth !== undefined ? ` · answer ${record.ground_truth}` : "", metrics ? ` · ${metrics}` : ""),
    frameNote(record),
    record.failure ? el("p", {class: "error"}, record.failure) : null,
    record.error && record.error.traceback
      ? el("details", {class: "prompt traceback"}, el("summary", {}, "traceback"), el("pre", {}, record.error.traceback))
      : null,
    record.messages ? conversation(record.messages) : null,
    el("div", {class: "controls"}, "color tokens by ",
       V.segmented("color", modes, V.ui.mode, (m) => { V.ui.mode = m; V.render(); }),
       phase === "val" ? el("a", {href: `#/case/${encodeURIComponent(record.case)}`, class: "pill"},
                            "this room at every validation step") : null),
    modeLegend(V.ui.mode, hasAdv, scale),
    symbols ? R.boardLegend(record.turns.map((t) => t.observation), symbols) : null,
    el("div", {id: "turns"}, record.turns.map((t, k) => turnCard(record, t, k, scale)), endCard(record))];
};

function conversation(messages) {
  const el = R.el;
  return el("details", {class: "prompt conversation"},
    el("summary", {}, `the conversation as the harness sent it (${messages.length} messages)`),
    messages.map((m) => el("div", {class: "message"}, el("div", {class: "label"}, m.role), el("pre", {}, m.content))));
}

function endCard(record) {
  const el = R.el;
  if (record.final_observation === undefined || record.final_observation === null) return null;
  return el("section", {class: "card turn end"},
    el("div", {class: "observation"}, R.board(record.final_observation, V.symbolsOf(record.tag))),
    el("div", {class: "reply"}, el("div", {class: "facts"}, el("b", {}, "End"), V.outcomeBadge(record),
                                   el("span", {}, `score ${R.fmt(record.score)}`)),
       el("p", {class: "muted"}, "what the env showed after the last action")));
}

// ------------------------------------------------------------------------------------------------- validation
async function validationRecords() {
  const dumps = V.dumpsOf("val");
  const loaded = await Promise.all(dumps.map((d) => V.loadDump("val", d.step)));
  const byCase = new Map();
  dumps.forEach((d, i) => {
    for (const r of loaded[i]) {
      if (!byCase.has(r.case)) byCase.set(r.case, {case: r.case, tag: r.tag, first: r, at: {}});
      byCase.get(r.case).at[d.step] = byCase.get(r.case).at[d.step] || r;  // one trajectory per room and step
    }
  });
  return {steps: dumps.map((d) => d.step), cases: [...byCase.values()]};
}

function outcomeChange(row, steps) {
  const ok = (s) => (row.at[s] ? (row.at[s].success ? 1 : 0) : null);
  const first = ok(steps[0]), last = ok(steps[steps.length - 1]);
  return first === null || last === null ? 0 : last - first;
}

V.validationPage = async function () {
  const el = R.el;
  const {steps, cases} = await validationRecords();
  const head = [V.crumbs(["Overview", "#/"], "Validation"), el("h1", {}, "Validation across steps")];
  if (!steps.length) return [...head, el("p", {class: "muted"}, "No validation dumps in this run.")];
  let rows = cases;
  if (V.ui.valSort !== "room") {
    const sign = V.ui.valSort === "improved" ? -1 : 1;
    rows = [...cases].sort((a, b) => sign * (outcomeChange(a, steps) - outcomeChange(b, steps)));
  }
  const rate = (s) => V.mean(cases.filter((c) => c.at[s]).map((c) => (c.at[s].success ? 1 : 0)));
  const table = el("table", {id: "val-matrix", class: "grid-table"},
    el("thead", {},
      el("tr", {}, el("th", {}, "room"), el("th", {}, "start"), steps.map((s) => el("th", {}, `step ${s}`))),
      el("tr", {class: "rates"}, el("th", {}, "success"), el("th", {}),
         steps.map((s) => el("th", {}, R.fmt(rate(s), true))))),
    el("tbody", {}, rows.map((row) => el("tr", {class: "clickable", dataset: {case: row.case},
      onclick: () => { location.hash = `#/case/${encodeURIComponent(row.case)}`; }},
      el("td", {}, el("a", {href: `#/case/${encodeURIComponent(row.case)}`}, row.case)),
      el("td", {}, row.first.turns.length ? R.frames(row.first.turns[0], "sm") : null,
         row.first.turns.length && row.first.turns[0].observation !== null
           ? R.board(row.first.turns[0].observation, V.symbolsOf(row.tag), "xs") : ""),
      steps.map((s) => {
        const r = row.at[s];
        if (!r) return el("td", {class: "cell-none"}, "–");
        return el("td", {class: r.success ? "cell-ok" : "cell-no", title: `score ${R.fmt(r.score)}`},
                  `${r.success ? "✓" : "✗"} ${R.fmt(r.score)}`);
      })))));
  return [...head,
    el("p", {class: "muted"}, `${cases.length} rooms (fixed seeds) at ${steps.length} validation steps; `,
       "click a room to see its episodes side by side."),
    el("div", {class: "controls"}, "order ",
       V.segmented("order", [["room", "room order"], ["improved", "improved first"], ["worse", "got worse first"]],
                   V.ui.valSort, (v) => { V.ui.valSort = v; V.render(); })),
    el("div", {class: "scroll"}, table)];
};

function episodeColumn(step, r) {
  const el = R.el;
  const symbols = V.symbolsOf(r.tag);
  return el("div", {class: "episode card", dataset: {step}},
    el("h3", {}, el("a", {href: V.trajLink("val", step, r.id)}, `step ${step}`), " ", V.outcomeBadge(r)),
    el("p", {class: "muted"}, `score ${R.fmt(r.score)} · ${r.turns.length} turns`),
    r.turns.map((t, k) => el("div", {class: "mini-turn"}, R.frames(t, "sm"),
      t.observation !== null ? R.board(t.observation, symbols, "sm") : null,
      el("div", {}, `${k + 1}. `, t.action !== null ? el("code", {}, t.action) : R.tokens(t, "prob", 1),
         t.valid ? "" : el("span", {class: "badge no"}, "invalid"), ` reward ${R.fmt(t.reward)}`))),
    r.final_observation ? el("div", {class: "mini-turn"}, R.board(r.final_observation, symbols, "sm"),
                             el("div", {}, "end ", V.outcomeBadge(r))) : null);
}

V.casePage = async function (caseId) {
  const el = R.el;
  const {steps, cases} = await validationRecords();
  const row = cases.find((c) => c.case === caseId);
  if (!row) throw new Error(`room ${caseId} is not in the validation dumps`);
  const first = row.first;
  return [V.crumbs(["Overview", "#/"], ["Validation", "#/val"], caseId),
    el("h1", {}, "Room ", el("code", {}, caseId), " across validation steps"),
    first.turns[0] && first.turns[0].observation === null
      ? el("details", {open: ""}, el("summary", {}, "prompt"), el("pre", {}, first.turns[0].prompt)) : null,
    first.ground_truth !== undefined ? el("p", {}, "answer: ", el("code", {}, first.ground_truth)) : null,
    el("div", {id: "episodes", class: "side-by-side"},
       steps.filter((s) => row.at[s]).map((s) => episodeColumn(s, row.at[s])))];
};
