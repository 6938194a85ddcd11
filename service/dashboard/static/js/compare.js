// Jobs side by side (#/compare?jobs=12,13,14&metric=val/loss): one metric of each on one
// chart, picked from every metric any of them reported, and their specs and results in
// one table with the rows where they differ highlighted. Kept current while any of them
// still runs (a poll: a page of several jobs has no one event stream).

import { api } from "./api.js";
import { duration, fill, h, num, statusBadge, TERMINAL } from "./dom.js";
import { colourOf, metricsOf } from "./metrics.js";
import { OverlayChart } from "./overlay.js";

const MAX_JOBS = 30;
const REFRESH_MS = 3000;

/** "#/compare?jobs=1,2" for these job ids (and metric, when given). */
export function compareHash(ids, metric = "") {
  const query = new URLSearchParams({ jobs: ids.join(",") });
  if (metric) query.set("metric", metric);
  return `#/compare?${query.toString().replaceAll("%2C", ",")}`;
}

export function compareView(root, params) {
  const ids = [
    ...new Set(
      (params.get("jobs") || "")
        .split(",")
        .map(Number)
        .filter((n) => Number.isInteger(n) && n > 0),
    ),
  ].slice(0, MAX_JOBS);
  let metric = params.get("metric") || "";
  document.title = `Compare ${ids.join(", ")} — Trainyard`;
  if (!ids.length) {
    fill(
      root,
      h("h2", {}, "Compare"),
      h(
        "p",
        { class: "muted" },
        "Tick two or more jobs on the ",
        h("a", { href: "#/jobs" }, "jobs list"),
        " (or trials on a sweep's page), then Compare.",
      ),
    );
    return undefined;
  }
  const stop = new AbortController();
  const signal = stop.signal;
  const ui = {
    picker: h("select", { id: "compare-metric", "aria-label": "Metric" }),
    onlyDiff: h("input", { type: "checkbox", id: "only-differences" }),
    logY: h("input", { type: "checkbox", id: "compare-log-y" }),
    notice: h("p", { class: "error", role: "alert", id: "compare-notice" }),
    missing: h("p", { class: "muted", id: "compare-missing" }),
    chart: h("div", { class: "overlay", id: "compare-chart" }),
    table: h("table", { class: "compare", id: "compare-table" }),
  };
  fill(
    root,
    h(
      "div",
      { class: "toolbar" },
      h("h2", {}, `Compare ${ids.length} job${ids.length === 1 ? "" : "s"}`),
      h("label", {}, "Metric ", ui.picker),
      h("label", {}, ui.logY, " log scale"),
      h("span", { class: "grow" }),
      h("label", {}, ui.onlyDiff, " only differences"),
    ),
    ui.notice,
    h("section", { class: "card" }, ui.chart, ui.missing),
    h("section", { class: "card compare-card" }, ui.table),
  );
  const chart = new OverlayChart(ui.chart);
  const jobs = new Map(); // id -> job, in the order asked for
  const series = new Map(ids.map((id) => [id, new Map()])); // id -> name -> step -> value
  const colours = new Map(ids.map((id, i) => [id, colourOf(i)]));
  const complete = new Set(); // jobs whose every point is here: ended when last read

  ui.picker.addEventListener("change", () => {
    metric = ui.picker.value;
    // The URL follows without a hashchange: the page keeps what it loaded.
    history.replaceState(null, "", compareHash(ids, metric));
    drawChart();
  });
  ui.logY.addEventListener("change", () => drawChart());
  ui.onlyDiff.addEventListener("change", () => {
    ui.table.classList.toggle("only-differences", ui.onlyDiff.checked);
  });

  function drawChart() {
    const names = [...new Set([...series.values()].flatMap((m) => [...m.keys()]))].sort(byName);
    if (!names.includes(metric)) metric = pickDefault(names);
    const options = names.map((n) => h("option", { value: n, selected: n === metric }, n));
    if (ui.picker.options.length !== names.length || ui.picker.value !== metric) {
      fill(ui.picker, options.length ? options : h("option", { value: "" }, "no metrics yet"));
    }
    ui.chart.dataset.metric = metric;
    const curves = [];
    const without = [];
    for (const [id, job] of jobs) {
      const points = series.get(id).get(metric);
      if (!points?.size) {
        without.push(id);
        continue;
      }
      curves.push({
        key: id,
        label: labelOf(job),
        colour: colours.get(id),
        points: [...points].sort((a, b) => a[0] - b[0]),
      });
    }
    chart.set(curves, { logY: ui.logY.checked });
    fill(
      ui.missing,
      metric && without.length ? `No ${metric} from job ${without.join(", job ")}.` : "",
    );
  }

  async function load() {
    const answers = await Promise.allSettled(ids.map((id) => api.get(`/jobs/${id}`, { signal })));
    if (signal.aborted) return;
    const refused = [];
    answers.forEach((a, i) => {
      if (a.status === "fulfilled") jobs.set(ids[i], a.value);
      else refused.push(`job ${ids[i]}: ${a.reason.message}`);
    });
    // The metrics of jobs still running (and, the first time, of all): from a step
    // before the last seen, since a step's metrics may come in more than one write.
    await Promise.all(
      [...jobs.values()].map(async (job) => {
        if (complete.has(job.id)) return;
        const mine = series.get(job.id);
        let last = -1;
        for (const steps of mine.values())
          for (const step of steps.keys()) last = Math.max(last, step);
        const points = await metricsOf(job.id, { afterStep: Math.max(-1, last - 1), signal });
        for (const p of points) {
          if (!mine.has(p.name)) mine.set(p.name, new Map());
          mine.get(p.name).set(p.step, p.value);
        }
        if (TERMINAL.has(job.status)) complete.add(job.id);
      }),
    );
    fill(ui.notice, refused.join("\n"));
    drawChart();
    drawTable(ui.table, [...jobs.values()], colours);
    return [...jobs.values()].some((j) => !TERMINAL.has(j.status));
  }

  let timer = 0;
  const refresh = () =>
    load().then(
      (again) => {
        if (again && !signal.aborted) timer = setTimeout(refresh, REFRESH_MS);
      },
      (err) => {
        if (signal.aborted) return;
        fill(ui.notice, err.message);
        timer = setTimeout(refresh, REFRESH_MS);
      },
    );
  refresh();
  return () => {
    stop.abort();
    clearTimeout(timer);
    chart.destroy();
  };
}

function labelOf(job) {
  return job.name ? `job ${job.id}: ${job.name}` : `job ${job.id}`;
}

/** Losses first (the usual thing to compare), then by name. */
function byName(a, b) {
  return /loss$/.test(b) - /loss$/.test(a) || a.localeCompare(b);
}

function pickDefault(names) {
  return names.find((n) => n === "val/loss") ?? names[0] ?? "";
}

/** The table: a column per job, a row per field, the rows that differ marked. */
function drawTable(table, jobs, colours) {
  const records = jobs.map(recordOf);
  const head = h(
    "thead",
    {},
    h(
      "tr",
      {},
      h("th", {}, ""),
      jobs.map((job) =>
        h(
          "th",
          { "data-job-id": job.id },
          h("span", { class: "swatch", style: `background: ${colours.get(job.id)}` }),
          h("a", { href: `#/jobs/${job.id}` }, `Job ${job.id}`),
          job.name ? h("small", {}, ` ${job.name}`) : null,
          " ",
          statusBadge(job.status),
        ),
      ),
    ),
  );
  const sections = ["spec", "result"].map((section) => {
    const keys = [...new Set(records.flatMap((r) => Object.keys(r[section])))];
    const rows = keys
      .map((key) => [key, records.map((r) => r[section][key])])
      .filter(([, values]) => values.some((v) => v !== null && v !== undefined));
    return h(
      "tbody",
      { "data-section": section },
      h("tr", { class: "section" }, h("th", { colspan: jobs.length + 1 }, section)),
      rows.map(([key, values]) => {
        const differs = new Set(values.map((v) => JSON.stringify(v ?? null))).size > 1;
        return h(
          "tr",
          { class: differs ? "differs" : "same", "data-field": key },
          h("th", {}, key),
          values.map((v) => h("td", {}, shown(v))),
        );
      }),
    );
  });
  fill(table, head, sections);
}

// The spec fields in the order the submit form has them; params and data one row a key.
const SPEC = (
  "recipe entrypoint code requirements strategy devices nodes accelerator gpu_memory_gb " +
  "epochs batch_size lr optimizer seed precision priority preemptible max_attempts " +
  "retries_on_error timeout_s checkpoint_every"
).split(" ");

/** What a job is and what it gave, flattened to one value a field. */
function recordOf(job) {
  const spec = { owner: job.owner, sweep: job.sweep_id ?? null };
  for (const key of SPEC) {
    const value = job[key];
    spec[key] = Array.isArray(value) ? value.join(" ") : value;
  }
  for (const [k, v] of Object.entries(job.params ?? {})) spec[`params.${k}`] = v;
  for (const [k, v] of Object.entries(job.data ?? {})) spec[`data.${k}`] = v;
  const ran =
    job.started_at && job.finished_at
      ? Date.parse(job.finished_at) - Date.parse(job.started_at)
      : null;
  const result = {
    status: job.status,
    reason: job.reason ? job.reason.code : null,
    attempts: job.attempt,
    ran: ran === null ? null : duration(ran / 1000),
    ...(job.result ?? {}),
    error: job.error ? `${job.error.type ?? "error"}: ${job.error.message ?? ""}` : null,
  };
  return { spec, result };
}

function shown(value) {
  if (value === null || value === undefined) return h("span", { class: "muted" }, "–");
  if (typeof value === "object") return JSON.stringify(value);
  return typeof value === "number" ? num(value, 6) : String(value);
}
