// The job list, newest first, filterable by status and owner (my jobs / everyone / one
// user's); refreshed by polling, since a list has no event stream of its own. Jobs ticked
// here open side by side in the compare view.

import { api } from "./api.js";
import { compareHash } from "./compare.js";
import {
  fill,
  h,
  num,
  pagerLinks,
  progressBar,
  STATUSES,
  statusBadge,
  viewHash,
  when,
} from "./dom.js";

const PAGE_SIZE = 50;
const REFRESH_MS = 2000;
// The ticked jobs, kept while the page is open: across refreshes, filters and pages.
const ticked = new Set();

export function jobsView(root, params) {
  const status = params.get("status") || "";
  const owner = params.get("owner") || ""; // "me", a user's name, or "": everyone's
  const offset = Math.max(0, Number(params.get("offset")) || 0);
  const stop = new AbortController();
  const signal = stop.signal;

  const filter = h(
    "select",
    { id: "status-filter", "aria-label": "Status" },
    h("option", { value: "" }, "all statuses"),
    STATUSES.map((s) => h("option", { value: s, selected: s === status }, s)),
  );
  // The filters live in the URL: reloads, links and the back button keep them.
  filter.addEventListener("change", () => {
    location.hash = jobsHash({ status: filter.value, owner });
  });
  const total = h("span", { class: "muted", id: "jobs-total" });
  const pager = h("span", { class: "pager" });
  const notice = h("p", { class: "error", role: "alert" });
  const rows = h("tbody");
  rows.addEventListener("change", (event) => {
    const box = event.target;
    if (!box.classList.contains("tick")) return;
    const id = Number(box.value);
    if (box.checked) ticked.add(id);
    else ticked.delete(id);
    showTicked();
  });
  const compare = h("button", { id: "compare-jobs", type: "button" });
  const untick = h("button", { id: "untick-jobs", type: "button", class: "quiet-light" }, "clear");
  const showTicked = () => {
    fill(compare, `Compare${ticked.size ? ` ${ticked.size}` : ""}`);
    compare.disabled = ticked.size < 2;
    compare.title = ticked.size < 2 ? "Tick two or more jobs to compare them" : "";
    untick.hidden = !ticked.size;
  };
  compare.addEventListener("click", () => {
    location.hash = compareHash([...ticked].sort((a, b) => a - b));
  });
  untick.addEventListener("click", () => {
    ticked.clear();
    for (const box of rows.querySelectorAll("input.tick")) box.checked = false;
    showTicked();
  });
  showTicked();
  const table = h(
    "table",
    { class: "jobs", id: "jobs", "data-loaded": "" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["ID", "Name", "Owner", "Recipe", "Status", "Progress", "Reason", "Created"].map((c) =>
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
      ownerToggle(status, owner),
      total,
      h("span", { class: "grow" }),
      pager,
      untick,
      compare,
      h("a", { class: "button", href: "#/submit" }, "New job"),
    ),
    notice,
    table,
  );

  async function refresh() {
    const query = new URLSearchParams({ limit: PAGE_SIZE, offset });
    if (status) query.set("status", status);
    if (owner) query.set("owner", owner);
    try {
      const page = await api.get(`/jobs?${query}`, { signal });
      fill(
        rows,
        page.items.length
          ? page.items.map(row)
          : h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No jobs.")),
      );
      fill(total, `${page.total} job${page.total === 1 ? "" : "s"}`);
      fill(pager, pagerLinks(page, (offset) => jobsHash({ status, owner, offset })));
      fill(notice, "");
      // which filters the rows are for
      table.dataset.loaded = status || "all";
      table.dataset.owner = owner || "everyone";
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
    // the tick in the ID's cell: the columns stay as they were for people's scripts
    h(
      "td",
      { class: "id" },
      h("input", {
        type: "checkbox",
        class: "tick",
        value: job.id,
        checked: ticked.has(job.id),
        "aria-label": `Compare job ${job.id}`,
      }),
      link(String(job.id)),
    ),
    h("td", {}, link(job.name || "–")),
    h("td", { class: "owner" }, h("a", { href: jobsHash({ owner: job.owner }) }, job.owner)),
    h("td", {}, job.recipe ?? h("code", {}, (job.entrypoint ?? []).join(" "))),
    h("td", {}, statusBadge(job.status)),
    h(
      "td",
      { class: "progress-cell" },
      progressBar(p, job.status),
      p ? h("small", {}, `epoch ${p.epoch}/${p.epochs} · loss ${num(p.loss, 3)}`) : null,
    ),
    reasonCell(job.reason),
    h("td", {}, when(job.created_at)),
  );
}

/** The reason's first line, cut to the column with an ellipsis; the whole text (a pip
 * log, the end of stderr) in the tooltip and on the job's page. */
function reasonCell(reason) {
  if (!reason) return h("td", { class: "reason" });
  const lines = reason.message.trim().split("\n");
  return h(
    "td",
    { class: "reason", title: `${reason.code}: ${reason.message.trimEnd()}` },
    h("span", { class: "first-line" }, lines[0], lines.length > 1 ? " …" : ""),
  );
}

const jobsHash = (filters) => viewHash("jobs", filters);

/** "my jobs | everyone", and the user's name when the list is one other user's. */
function ownerToggle(status, owner) {
  const choice = (id, value, text) =>
    h(
      "a",
      {
        id,
        href: jobsHash({ status, owner: value }),
        class: owner === value ? "current" : null,
        "aria-current": owner === value ? "page" : null,
      },
      text,
    );
  return h(
    "span",
    { class: "toggle", role: "group", "aria-label": "Whose jobs" },
    choice("owner-me", "me", "my jobs"),
    choice("owner-everyone", "", "everyone"),
    owner && owner !== "me" ? choice("owner-named", owner, `${owner}'s`) : null,
  );
}
