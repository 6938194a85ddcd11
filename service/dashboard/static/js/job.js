// One job: its owner, status, progress with ETA, live charts of every metric, log tail,
// artifacts, spec, result, error and the reproducibility record, all kept current by the
// job's event stream. Cancel and rerun are offered to the job's owner and to admins only,
// as the server allows; should it refuse anyway (403, naming the owner), that is shown.

import { api, TOKEN_SAVED } from "./api.js";
import { ArtifactList } from "./artifacts.js";
import { MetricCharts } from "./chart.js";
import {
  duration,
  fill,
  fraction,
  h,
  num,
  progressBar,
  statusBadge,
  TERMINAL,
} from "./dom.js";
import { LogTail } from "./logtail.js";
import { pairs, specOf } from "./record.js";
import { mayAct, whoAmI } from "./session.js";
import { followEvents } from "./sse.js";

// How often a job across boxes is read again while its gang forms (no event says so).
const GANG_POLL_MS = 5000;

export function jobView(root, id) {
  const stop = new AbortController();
  const signal = stop.signal;
  const ui = skeleton(id);
  fill(root, ui.page);
  const charts = new MetricCharts(ui.charts);
  const log = new LogTail(ui.log, ui.logCount);
  const artifacts = new ArtifactList(ui.artifacts, ui.artifactsNotice, id, signal);
  let job = null;
  let me = null; // who the page acts as, once known: decides the buttons
  let gangTimer = null;

  const show = (next) => {
    if (next.status !== job?.status) artifacts.refresh();
    job = next;
    renderJob(ui, job);
    renderButtons(ui, job, me);
    clearTimeout(gangTimer);
    if (job.nodes > 1 && job.status === "queued") gangTimer = setTimeout(reread, GANG_POLL_MS);
  };

  // A job across boxes: its nodes (node_list) and how many have joined (the reason) are
  // in the GET's answer only, not in a status event's, which is the job row. Read it
  // again on each status event and while it waits; only the newest read is drawn.
  let reads = 0;
  const reread = () => {
    const mine = ++reads;
    api
      .get(`/jobs/${id}`, { signal })
      .then((fresh) => {
        if (mine === reads) show(fresh);
      })
      .catch(() => {}); // the stream's state already says when the API is away
  };
  const onStatus = (data) => {
    if (!(data.nodes > 1)) {
      show(data);
      return;
    }
    // Until the read answers, the nodes last seen (none once it has ended).
    show({ ...data, node_list: TERMINAL.has(data.status) ? [] : (job?.node_list ?? null) });
    reread();
  };

  ui.cancel.addEventListener("click", async () => {
    if (!confirm(`Cancel job ${id}?`)) return;
    fill(ui.notice, "");
    ui.cancel.disabled = true;
    try {
      show(await api.post(`/jobs/${id}/cancel`));
    } catch (err) {
      fill(ui.notice, err.message);
      ui.cancel.disabled = false;
    }
  });

  ui.rerun.addEventListener("click", async () => {
    if (!confirm(`Submit a new job with job ${id}'s spec?`)) return;
    fill(ui.notice, "");
    ui.rerun.disabled = true;
    try {
      const rerun = await api.post(`/jobs/${id}/rerun`);
      location.hash = `#/jobs/${rerun.id}`;
    } catch (err) {
      fill(ui.notice, err.message);
      ui.rerun.disabled = false;
    }
  });

  // Stream bookkeeping on the page element, for devtools and the browser test: its
  // state, how often it connected, and how many events of each kind came (duplicates
  // included), as data-stream, data-connects, data-log-events, data-metric-events …
  const counts = ui.page.dataset;
  const onEvent = (type, data) => {
    counts[`${type}Events`] = Number(counts[`${type}Events`] ?? 0) + 1;
    if (type === "status") onStatus(data);
    else if (type === "progress") {
      renderProgress(ui, data, job?.status);
      artifacts.refresh({ running: true }); // checkpoints appear as it trains
    } else if (type === "metric") charts.add(data);
    else if (type === "log") log.add(data);
  };
  const onState = (state) => {
    counts.stream = state;
    if (state === "live") counts.connects = Number(counts.connects ?? 0) + 1;
    ui.stream.textContent = { live: "live", reconnecting: "reconnecting…", ended: "" }[state];
  };

  // Signed in anew after a refused request: the buttons follow the new user.
  const learnWho = () =>
    whoAmI().then(
      (who) => {
        me = who;
        if (job) renderButtons(ui, job, me);
      },
      () => {
        me = null;
        if (job) renderButtons(ui, job, me);
      },
    );
  window.addEventListener(TOKEN_SAVED, learnWho);
  learnWho();

  // The GET draws the page at once and answers "no such job" plainly; the stream then
  // replays everything from the job's start and follows it live.
  api
    .get(`/jobs/${id}`, { signal })
    .then((first) => {
      show(first);
      return followEvents(`/jobs/${id}/events`, onEvent, { signal, onState });
    })
    .catch((err) => {
      if (!signal.aborted) fill(ui.notice, err.message);
    });

  return () => {
    stop.abort();
    clearTimeout(gangTimer);
    window.removeEventListener(TOKEN_SAVED, learnWho);
    charts.destroy();
    log.destroy();
  };
}

function skeleton(id) {
  const ui = {
    title: h("h2", {}, `Job ${id}`),
    status: h("span", { id: "job-status" }),
    owner: h("span", { class: "muted", id: "job-owner" }),
    sweep: h("a", { id: "job-sweep", class: "sweep-link", hidden: true }),
    stream: h("span", { class: "stream-state muted", id: "stream-state" }),
    rerun: h("button", { id: "rerun-job", hidden: true }, "Rerun"),
    cancel: h("button", { id: "cancel-job", class: "danger", hidden: true }, "Cancel"),
    notice: h("p", { class: "error", role: "alert", id: "job-notice" }),
    reason: h("div", { class: "reason", id: "job-reason" }),
    bar: h("div", { class: "progress-wide" }),
    progressText: h("p", { class: "muted", id: "progress-text" }),
    charts: h("div", { class: "charts", id: "charts", "data-empty": "No metric points yet." }),
    artifacts: h("div", { id: "artifacts" }, h("p", { class: "muted" }, "Loading…")),
    artifactsNotice: h("p", { class: "error", role: "alert", id: "artifacts-notice" }),
    log: h("div", { class: "log", id: "log", "data-empty": "No log lines yet." }),
    logCount: h("span", { class: "muted" }),
    spec: h("dl", { class: "pairs", id: "job-spec" }),
    result: h("section", { class: "card", id: "job-result", hidden: true }),
    error: h("section", { class: "card error-card", id: "job-error", hidden: true }),
    environment: h("dl", { class: "pairs", id: "job-environment" }),
  };
  ui.page = h(
    "article",
    { class: "job" },
    h(
      "div",
      { class: "job-head" },
      ui.title,
      ui.status,
      ui.owner,
      ui.sweep,
      ui.stream,
      h("span", { class: "grow" }),
      ui.rerun,
      ui.cancel,
    ),
    ui.notice,
    ui.reason,
    ui.bar,
    ui.progressText,
    ui.error,
    h("section", { class: "card" }, h("h3", {}, "Metrics"), ui.charts),
    h("section", { class: "card" }, h("h3", {}, "Log ", ui.logCount), ui.log),
    ui.result,
    h("section", { class: "card" }, h("h3", {}, "Artifacts"), ui.artifactsNotice, ui.artifacts),
    h(
      "div",
      { class: "columns" },
      h("section", { class: "card" }, h("h3", {}, "Spec"), ui.spec),
      h("section", { class: "card" }, h("h3", {}, "Reproducibility record"), ui.environment),
    ),
  );
  return ui;
}

function renderJob(ui, job) {
  document.title = `Job ${job.id} · ${job.status} — Trainyard`;
  fill(ui.title, `Job ${job.id}`, job.name ? h("small", {}, ` ${job.name}`) : null);
  fill(ui.status, statusBadge(job.status));
  fill(ui.owner, `by ${job.owner}`);
  ui.owner.dataset.owner = job.owner;
  // a trial of a sweep: back to the sweep, with its other trials
  ui.sweep.hidden = !job.sweep_id;
  if (job.sweep_id) {
    ui.sweep.href = `#/sweeps/${job.sweep_id}`;
    fill(ui.sweep, `trial of sweep ${job.sweep_id}`);
  }
  renderReason(ui.reason, job.reason);
  renderProgress(ui, job.progress, job.status);
  fill(ui.spec, pairs(specOf(job)));
  fill(
    ui.environment,
    job.environment ? pairs(job.environment) : h("dd", { class: "muted" }, "not run yet"),
  );
  ui.result.hidden = !job.result;
  if (job.result) {
    fill(ui.result, h("h3", {}, "Result"), h("dl", { class: "pairs" }, pairs(job.result)));
  }
  ui.error.hidden = !job.error;
  if (job.error) {
    const { type, message, traceback } = job.error;
    fill(
      ui.error,
      h("h3", {}, "Error"),
      h("p", {}, h("strong", {}, type ?? "error"), `: ${message ?? ""}`),
      traceback ? h("pre", {}, [].concat(traceback).join("\n")) : null,
    );
  }
}

/** Cancel while it may still run, rerun once it ended: for its owner or an admin only
 * (``me`` null: not known yet, or not signed in). */
function renderButtons(ui, job, me) {
  const may = me !== null && mayAct(me, job.owner);
  ui.page.dataset.mayAct = me === null ? "" : String(may);
  ui.cancel.hidden = !may || TERMINAL.has(job.status);
  ui.rerun.hidden = !may || !TERMINAL.has(job.status);
  ui.cancel.disabled = job.status === "cancelling";
}

/** One line as it is; a longer text (a pip log, the end of stderr) whole, scrollable. */
function renderReason(el, reason) {
  const text = reason?.message.trimEnd() ?? "";
  // drawn again only when it changed: a long reason keeps where its reader scrolled it
  const drawn = `${reason?.code}\n${text}`;
  if (el.dataset.drawn === drawn) return;
  el.dataset.drawn = drawn;
  if (!text.includes("\n")) {
    fill(el, reason ? `${text} (${reason.code})` : "");
    return;
  }
  fill(
    el,
    h("span", { class: "reason-code" }, reason.code),
    h("pre", { class: "reason-text", tabindex: 0 }, text), // tabindex: scrolls by keyboard
  );
}

function renderProgress(ui, progress, status) {
  fill(ui.bar, progressBar(progress, status));
  if (!progress) {
    fill(ui.progressText, "");
    return;
  }
  const p = progress;
  const pct = Math.round(fraction(p) * 100);
  const parts = [
    `epoch ${p.epoch}/${p.epochs}`,
    `step ${p.step}/${p.total_steps} (${pct}%)`,
    `loss ${num(p.loss)}`,
    p.samples_per_s ? `${Math.round(p.samples_per_s)} samples/s` : null,
    TERMINAL.has(status) ? null : `ETA ${duration(p.eta_s)}`,
  ];
  fill(ui.progressText, parts.filter(Boolean).join(" · "));
}
