// The sweeps list, newest first, filterable by status and owner; refreshed by polling.

import { api } from "./api.js";
import { fill, h, num, pagerLinks, viewHash, when } from "./dom.js";
import { scoreOf } from "./parallel.js";

const PAGE_SIZE = 50;
const REFRESH_MS = 2000;
export const SWEEP_STATUSES = ["running", "finished", "cancelled", "failed"];

/** A sweep's status as a badge, in the colours of the job statuses it resembles. */
export function sweepBadge(status) {
  return h("span", { class: `badge sweep-${status}`, "data-status": status }, status);
}

/** How many trials a sweep will run: max_trials, else a grid's size (its default). */
export function plannedTrials(spec) {
  if (spec.max_trials) return spec.max_trials;
  if (spec.search !== "grid") return null;
  let size = 1;
  for (const p of Object.values(spec.parameters)) {
    if (p.type === "categorical") size *= p.values.length;
    else if (p.step) size *= Math.floor((p.high - p.low) / p.step + 1e-9) + 1;
    else return null;
  }
  return size;
}

/** "12 of 20 ended · 3 running · 2 pruned", from a sweep's counts: of the trials it will
 * run while it runs, of those it ran once it ended. */
export function countsText(sweep) {
  const counts = sweep.counts;
  const ended = counts.succeeded + counts.failed + counts.cancelled + counts.pruned;
  const planned = sweep.status === "running" ? plannedTrials(sweep.spec) : null;
  const of = Math.max(planned ?? 0, counts.total);
  return [
    `${ended} of ${of} ended`,
    counts.running ? `${counts.running} running` : null,
    counts.queued ? `${counts.queued} queued` : null,
    counts.succeeded ? `${counts.succeeded} succeeded` : null,
    counts.pruned ? `${counts.pruned} pruned` : null,
    counts.failed ? `${counts.failed} failed` : null,
    counts.cancelled ? `${counts.cancelled} cancelled` : null,
  ]
    .filter(Boolean)
    .join(" · ");
}

export function sweepsView(root, params) {
  const status = params.get("status") || "";
  const owner = params.get("owner") || "";
  const offset = Math.max(0, Number(params.get("offset")) || 0);
  const stop = new AbortController();
  const signal = stop.signal;

  const filter = h(
    "select",
    { id: "sweep-status-filter", "aria-label": "Status" },
    h("option", { value: "" }, "all statuses"),
    SWEEP_STATUSES.map((s) => h("option", { value: s, selected: s === status }, s)),
  );
  filter.addEventListener("change", () => {
    location.hash = sweepsHash({ status: filter.value, owner });
  });
  const mine = (value, text) =>
    h(
      "a",
      { href: sweepsHash({ status, owner: value }), class: owner === value ? "current" : null },
      text,
    );
  const total = h("span", { class: "muted", id: "sweeps-total" });
  const pager = h("span", { class: "pager" });
  const notice = h("p", { class: "error", role: "alert" });
  const rows = h("tbody");
  const columns = [
    "ID",
    "Name",
    "Owner",
    "Status",
    "Search",
    "Metric",
    "Trials",
    "Best",
    "Created",
  ];
  const table = h(
    "table",
    { class: "jobs", id: "sweeps", "data-loaded": "" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        columns.map((c) => h("th", {}, c)),
      ),
    ),
    rows,
  );
  fill(
    root,
    h(
      "div",
      { class: "toolbar" },
      h("h2", {}, "Sweeps"),
      h("label", {}, "Status ", filter),
      h(
        "span",
        { class: "toggle", role: "group", "aria-label": "Whose sweeps" },
        mine("me", "my sweeps"),
        mine("", "everyone"),
      ),
      total,
      h("span", { class: "grow" }),
      pager,
    ),
    notice,
    table,
    h(
      "p",
      { class: "muted" },
      "Start one with ",
      h("code", {}, "trainyard sweep create sweep.yaml"),
      " or POST /api/v1/sweeps.",
    ),
  );

  let timer = 0;
  async function refresh() {
    const query = new URLSearchParams({ limit: PAGE_SIZE, offset });
    if (status) query.set("status", status);
    if (owner) query.set("owner", owner);
    try {
      const page = await api.get(`/sweeps?${query}`, { signal });
      fill(
        rows,
        page.items.length
          ? page.items.map(row)
          : h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, "No sweeps.")),
      );
      fill(total, `${page.total} sweep${page.total === 1 ? "" : "s"}`);
      fill(pager, pagerLinks(page, (offset) => sweepsHash({ status, owner, offset })));
      fill(notice, "");
      table.dataset.loaded = status || "all";
    } catch (err) {
      if (signal.aborted) return;
      fill(notice, err.message);
    }
    if (!signal.aborted) timer = setTimeout(refresh, REFRESH_MS);
  }
  refresh();
  return () => {
    stop.abort();
    clearTimeout(timer);
  };
}

function row(sweep) {
  const link = (text) => h("a", { href: `#/sweeps/${sweep.id}` }, text);
  const spec = sweep.spec;
  return h(
    "tr",
    { "data-sweep-id": sweep.id, "data-status": sweep.status },
    h("td", {}, link(String(sweep.id))),
    h("td", {}, link(sweep.name || "–")),
    h("td", { class: "owner" }, sweep.owner),
    h("td", {}, sweepBadge(sweep.status)),
    h("td", {}, spec.search),
    h("td", {}, h("code", {}, spec.metric), ` ${spec.mode}`),
    h("td", { class: "counts" }, countsText(sweep)),
    h(
      "td",
      {},
      sweep.best
        ? h(
            "a",
            { href: `#/jobs/${sweep.best.job_id}` },
            `${num(scoreOf(sweep.best))} (#${sweep.best.number})`,
          )
        : "–",
    ),
    h("td", {}, when(sweep.created_at)),
  );
}

const sweepsHash = (filters) => viewHash("sweeps", filters);
