// One sweep: its status and counts, the best trial, the chosen metric's curve of every
// trial on one chart (the best's drawn thick), its parameters against the metric in
// parallel coordinates, and its trials as a sortable table to open or compare. Read
// again every few seconds while it runs (a sweep has no event stream of its own). Cancel
// is offered to its owner and to admins, as for a job.

import { api, TOKEN_SAVED } from "./api.js";
import { compareHash } from "./compare.js";
import { fill, h, num, TERMINAL, when } from "./dom.js";
import { metricsOf } from "./metrics.js";
import { OverlayChart } from "./overlay.js";
import { ParallelCoordinates, scoreOf, trialColours } from "./parallel.js";
import { pairs } from "./record.js";
import { mayAct, whoAmI } from "./session.js";
import { countsText, sweepBadge } from "./sweeps.js";
import { TrialTable } from "./trials.js";

const REFRESH_MS = 2000;
const AT_ONCE = 8; // metric reads in flight at once (a sweep may have hundreds of trials)

export function sweepView(root, id) {
  const stop = new AbortController();
  const signal = stop.signal;
  const ui = skeleton(id);
  fill(root, ui.page);
  const chart = new OverlayChart(ui.chart);
  const parallel = new ParallelCoordinates(ui.parallel);
  const curves = new Map(); // job id -> {points: Map step -> value, last step, complete}
  let table = null; // made with the first answer: its columns are the sweep's parameters
  let sweep = null;
  let me = null;
  let timer = 0;

  const showTicked = () => {
    const n = table ? table.tickedJobs().length : 0;
    fill(ui.compare, `Compare selected${n ? ` (${n})` : ""}`);
    ui.compare.disabled = n < 2;
  };
  ui.logY.addEventListener("change", () => drawCurves());
  ui.compare.addEventListener("click", () => {
    location.hash = compareHash(table.tickedJobs(), sweep.spec.metric);
  });
  ui.cancel.addEventListener("click", async () => {
    if (!confirm(`Cancel sweep ${id} and every trial it has not finished?`)) return;
    fill(ui.notice, "");
    ui.cancel.disabled = true;
    try {
      show(await api.post(`/sweeps/${id}/cancel`));
    } catch (err) {
      fill(ui.notice, err.message);
      ui.cancel.disabled = false;
    }
  });

  const learnWho = () =>
    whoAmI().then(
      (who) => {
        me = who;
        if (sweep) renderButtons(ui, sweep, me);
      },
      () => {
        me = null;
        if (sweep) renderButtons(ui, sweep, me);
      },
    );
  window.addEventListener(TOKEN_SAVED, learnWho);
  learnWho();

  function show(next) {
    sweep = next;
    if (!table) {
      table = new TrialTable(Object.keys(sweep.spec.parameters), sweep.spec.metric);
      table.onTick = showTicked;
      fill(ui.trials, table.table);
      renderSpec(ui, sweep.spec);
    }
    renderSweep(ui, sweep);
    renderButtons(ui, sweep, me);
    table.set(sweep.trials, sweep.best?.number ?? null);
    showTicked();
    drawCurves();
    parallel.set({
      parameters: sweep.spec.parameters,
      metric: sweep.spec.metric,
      mode: sweep.spec.mode,
      trials: sweep.trials,
      bestNumber: sweep.best?.number ?? null,
    });
  }

  /** Each trial's curve in the colour of its score, as in the parallel coordinates. */
  function drawCurves() {
    const colours = trialColours(sweep.trials, sweep.spec.mode);
    chart.set(
      sweep.trials
        .filter((t) => curves.get(t.job_id)?.points.size)
        .map((t) => {
          const best = t.number === sweep.best?.number;
          return {
            key: t.job_id,
            label: `#${t.number}${best ? " best" : ""}`,
            colour: colours.get(t.number),
            emphasised: best,
            points: [...curves.get(t.job_id).points].sort((a, b) => a[0] - b[0]),
          };
        }),
      { logY: ui.logY.checked },
    );
  }

  /** The metric's new points of every trial not known to have ended, a few at a time. */
  async function readCurves() {
    const metric = sweep.spec.metric;
    const due = sweep.trials.filter((t) => t.job_id !== null && !curves.get(t.job_id)?.complete);
    for (let i = 0; i < due.length; i += AT_ONCE) {
      await Promise.all(
        due.slice(i, i + AT_ONCE).map(async (t) => {
          const ended = TERMINAL.has(t.status); // before the read: its points are all in
          const curve = curves.get(t.job_id) ?? { points: new Map(), last: -1, complete: false };
          const points = await metricsOf(t.job_id, { name: metric, afterStep: curve.last, signal });
          for (const p of points) {
            curve.points.set(p.step, p.value);
            curve.last = Math.max(curve.last, p.step);
          }
          curve.complete = ended;
          curves.set(t.job_id, curve);
        }),
      );
    }
  }

  async function refresh() {
    try {
      const next = await api.get(`/sweeps/${id}`, { signal });
      show(next);
      await readCurves();
      drawCurves();
      fill(ui.notice, "");
      ui.page.dataset.loaded = next.status;
      const moving = next.status === "running" || next.trials.some((t) => !TERMINAL.has(t.status));
      if (!moving && [...curves.values()].every((c) => c.complete)) return;
    } catch (err) {
      if (signal.aborted) return;
      fill(ui.notice, err.message);
    }
    if (!signal.aborted) timer = setTimeout(refresh, REFRESH_MS);
  }
  refresh();

  return () => {
    stop.abort();
    clearTimeout(timer);
    window.removeEventListener(TOKEN_SAVED, learnWho);
    chart.destroy();
    parallel.destroy();
  };
}

function skeleton(id) {
  const ui = {
    title: h("h2", {}, `Sweep ${id}`),
    status: h("span", { id: "sweep-status" }),
    owner: h("span", { class: "muted", id: "sweep-owner" }),
    compare: h(
      "button",
      { id: "compare-trials", type: "button", disabled: true },
      "Compare selected",
    ),
    cancel: h(
      "button",
      { id: "cancel-sweep", class: "danger", type: "button", hidden: true },
      "Cancel sweep",
    ),
    notice: h("p", { class: "error", role: "alert", id: "sweep-notice" }),
    reason: h("p", { class: "reason muted", id: "sweep-reason" }),
    counts: h("p", { id: "sweep-counts" }),
    best: h("p", { id: "sweep-best" }),
    chartTitle: h("h3", {}, "Trials"),
    chart: h("div", { class: "overlay", id: "sweep-chart" }),
    logY: h("input", { type: "checkbox", id: "sweep-log-y" }),
    parallel: h("div", { class: "parallel-box", id: "sweep-parallel" }),
    trials: h("div", { class: "table-box" }),
    parameters: h("table", { class: "parameters", id: "sweep-parameters" }),
    spec: h("dl", { class: "pairs", id: "sweep-spec" }),
  };
  ui.page = h(
    "article",
    { class: "sweep", "data-loaded": "" },
    h(
      "div",
      { class: "job-head" },
      ui.title,
      ui.status,
      ui.owner,
      h("span", { class: "grow" }),
      ui.compare,
      ui.cancel,
    ),
    ui.notice,
    ui.reason,
    ui.counts,
    ui.best,
    h(
      "section",
      { class: "card" },
      h("div", { class: "card-head" }, ui.chartTitle, h("label", {}, ui.logY, " log scale")),
      ui.chart,
    ),
    h("section", { class: "card" }, h("h3", {}, "Parameters against the metric"), ui.parallel),
    h(
      "section",
      { class: "card" },
      h(
        "h3",
        {},
        "Trials ",
        h("small", { class: "muted" }, "click a header to sort; tick trials to compare them"),
      ),
      ui.trials,
    ),
    h(
      "div",
      { class: "columns" },
      h("section", { class: "card" }, h("h3", {}, "Search space"), ui.parameters),
      h("section", { class: "card" }, h("h3", {}, "Sweep spec"), ui.spec),
    ),
  );
  return ui;
}

function renderSweep(ui, sweep) {
  const spec = sweep.spec;
  document.title = `Sweep ${sweep.id} · ${sweep.status} — Trainyard`;
  fill(ui.title, `Sweep ${sweep.id}`, sweep.name ? h("small", {}, ` ${sweep.name}`) : null);
  fill(ui.status, sweepBadge(sweep.status));
  fill(ui.owner, `by ${sweep.owner}`);
  ui.owner.dataset.owner = sweep.owner;
  fill(ui.reason, sweep.reason ? `${sweep.reason.message} (${sweep.reason.code})` : "");
  const pruner = spec.pruner ? `${spec.pruner.type} pruning` : "no pruning";
  fill(
    ui.counts,
    h("strong", {}, countsText(sweep)),
    h(
      "span",
      { class: "muted" },
      ` · ${spec.search} search · ${pruner} · up to ${spec.max_parallel} at once`,
      ` · started ${when(sweep.created_at)}`,
      sweep.finished_at ? ` · ended ${when(sweep.finished_at)}` : "",
    ),
  );
  ui.counts.dataset.counts = JSON.stringify(sweep.counts);
  const best = sweep.best;
  fill(
    ui.best,
    best
      ? [
          h("span", { class: "best-mark" }, "★ best"),
          " trial ",
          h("a", { href: `#/jobs/${best.job_id}` }, `#${best.number} (job ${best.job_id})`),
          `: ${spec.metric} ${num(scoreOf(best), 6)} with `,
          h(
            "code",
            {},
            Object.entries(best.values)
              .map(([k, v]) => `${k}=${typeof v === "number" ? num(v, 4) : v}`)
              .join(" "),
          ),
        ]
      : h("span", { class: "muted" }, `No trial has reported ${spec.metric} yet.`),
  );
  ui.best.dataset.best = best ? best.number : "";
  fill(
    ui.chartTitle,
    `${spec.metric} of every trial `,
    h("small", { class: "muted" }, `${spec.mode}: the best drawn thick`),
  );
}

function renderButtons(ui, sweep, me) {
  const may = me !== null && mayAct(me, sweep.owner);
  ui.cancel.hidden = !may || sweep.status !== "running";
}

function renderSpec(ui, spec) {
  fill(
    ui.parameters,
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["parameter", "type", "range"].map((c) => h("th", {}, c)),
      ),
    ),
    h(
      "tbody",
      {},
      Object.entries(spec.parameters).map(([name, p]) =>
        h("tr", {}, h("th", {}, name), h("td", {}, p.type), h("td", {}, rangeOf(p))),
      ),
    ),
  );
  const rest = {
    search: spec.search,
    seed: spec.seed,
    metric: `${spec.metric} (${spec.mode})`,
    pruner: spec.pruner,
  };
  fill(ui.spec, pairs({ ...rest, ...spec.job }));
}

function rangeOf(p) {
  if (p.type === "categorical") return p.values.map((v) => JSON.stringify(v)).join(", ");
  const parts = [`${num(p.low, 6)} … ${num(p.high, 6)}`];
  if (p.step !== null && p.step !== undefined && !(p.type === "int" && p.step === 1))
    parts.push(`step ${num(p.step, 6)}`);
  if (p.log) parts.push("log");
  return parts.join(", ");
}
