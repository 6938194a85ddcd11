// The job list, newest first, filterable by status; refreshed by polling, since a
// list has no event stream of its own.

import { api } from "./api.js";
import { fill, h, num, progressBar, STATUSES, statusBadge, when } from "./dom.js";

const PAGE_SIZE = 50;
const REFRESH_MS = 2000;

export function jobsView(root, params) {
  const status = params.get("status") || "";
  const offset = Math.max(0, Number(params.get("offset")) || 0);
  const stop = new AbortController();
  const signal = stop.signal;

  const filter = h(
    "select",
    { id: "status-filter", "aria-label": "Status" },
    h("option", { value: "" }, "all statuses"),
    STATUSES.map((s) => h("option", { value: s, selected: s === status }, s)),
  );
  // The filter lives in the URL: reloads, links and the back button keep it.
  filter.addEventListener("change", () => {
    location.hash = filter.value ? `#/jobs?status=${filter.value}` : "#/jobs";
  });
  const total = h("span", { class: "muted", id: "jobs-total" });
  const pager = h("span", { class: "pager" });
  const notice = h("p", { class: "error", role: "alert" });
  const rows = h("tbody");
  const table = h(
    "table",
    { class: "jobs", id: "jobs", "data-loaded": "" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["ID", "Name", "Recipe", "Status", "Progress", "Reason", "Created"].map((c) =>
          h("th", {}, c),
        ),
      ),
    ),
    rows,
  );
  fill(
    root,
    h(
      "div",
      { class: "toolbar" },
      h("h2", {}, "Jobs"),
      h("label", {}, "Status ", filter),
      total,
      h("span", { class: "grow" }),
      pager,
      h("a", { class: "button", href: "#/submit" }, "New job"),
    ),
    notice,
    table,
  );

  async function refresh() {
    const query = new URLSearchParams({ limit: PAGE_SIZE, offset });
    if (status) query.set("status", status);
    try {
      const page = await api.get(`/jobs?${query}`, { signal });
      fill(
        rows,
        page.items.length
          ? page.items.map(row)
          : h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No jobs.")),
      );
      fill(total, `${page.total} job${page.total === 1 ? "" : "s"}`);
      fill(pager, pagerLinks(page, status));
      fill(notice, "");
      table.dataset.loaded = status || "all"; // which filter the rows are for
    } catch (err) {
      if (signal.aborted) return;
      fill(notice, err.message);
    }
    if (!signal.aborted) timer = setTimeout(refresh, REFRESH_MS);
  }
  let timer = 0;
  refresh();
  return () => {
    stop.abort();
    clearTimeout(timer);
  };
}

function row(job) {
  const link = (text) => h("a", { href: `#/jobs/${job.id}` }, text);
  const p = job.progress;
  return h(
    "tr",
    { "data-job-id": job.id, "data-status": job.status },
    h("td", {}, link(String(job.id))),
    h("td", {}, link(job.name || "–")),
    h("td", {}, job.recipe ?? h("code", {}, (job.entrypoint ?? []).join(" "))),
    h("td", {}, statusBadge(job.status)),
    h(
      "td",
      { class: "progress-cell" },
      progressBar(p, job.status),
      p ? h("small", {}, `epoch ${p.epoch}/${p.epochs} · loss ${num(p.loss, 3)}`) : null,
    ),
    h("td", { class: "reason", title: job.reason?.code ?? "" }, job.reason?.message ?? ""),
    h("td", {}, when(job.created_at)),
  );
}

function pagerLinks(page, status) {
  const at = (offset) => `#/jobs?${new URLSearchParams(status ? { status, offset } : { offset })}`;
  const last = Math.min(page.offset + page.items.length, page.total);
  return [
    page.offset > 0 ? h("a", { href: at(Math.max(0, page.offset - page.limit)) }, "‹ newer") : null,
    page.total > page.limit ? h("span", {}, ` ${page.offset + 1}–${last} `) : null,
    last < page.total ? h("a", { href: at(page.offset + page.limit) }, "older ›") : null,
  ];
}
