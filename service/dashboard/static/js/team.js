// The team's view: each user's fair-share usage, what their jobs hold and wait for, and
// their quotas; for admins, the audit trail below (a page of 50, newest first,
// filterable by who acted). Refreshed by polling, like the job list.

import { api } from "./api.js";
import { fill, h, num, pagerLinks, viewHash, when } from "./dom.js";
import { whoAmI } from "./session.js";

const AUDIT_PAGE_SIZE = 50;
const REFRESH_MS = 5000;

export function teamView(root, params) {
  const actor = params.get("actor") || "";
  const offset = Math.max(0, Number(params.get("offset")) || 0);
  const stop = new AbortController();
  const signal = stop.signal;

  const notice = h("p", { class: "error", role: "alert", id: "team-notice" });
  const usageRows = h("tbody");
  const usage = h(
    "table",
    { class: "jobs", id: "usage", "data-loaded": "" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        h("th", {}, "User"),
        h("th", { title: "Device-hours used, decayed: older use counts less" }, "Usage"),
        h("th", {}, "Running devices / quota"),
        h("th", {}, "Queued jobs / quota"),
      ),
    ),
    usageRows,
  );
  const page = h(
    "div",
    { class: "team" },
    h("div", { class: "toolbar" }, h("h2", {}, "Team")),
    notice,
    h(
      "p",
      { class: "muted" },
      "Least usage first: the order the queue serves users in. Usage is device-hours, " +
        "decayed: what was used one half-life ago counts half.",
    ),
    usage,
  );
  fill(root, page);

  let audit = null; // the admin's part, once /me said admin
  let timer = 0;

  async function refresh() {
    try {
      if (audit === null) {
        const me = await whoAmI();
        if (signal.aborted) return;
        page.dataset.user = me.name;
        audit = me.admin ? auditPart(actor, offset) : false;
        if (audit) page.append(audit.section);
      }
      const users = await api.get("/users/usage", { signal });
      const me = page.dataset.user;
      fill(
        usageRows,
        users.length
          ? users.map((u) => usageRow(u, u.name === me))
          : h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No users.")),
      );
      usage.dataset.loaded = "true";
      if (audit) await audit.refresh(signal);
      fill(notice, "");
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

function usageRow(user, mine) {
  return h(
    "tr",
    { "data-user": user.name, class: mine ? "mine" : null },
    h("td", {}, user.name, mine ? h("small", { class: "muted" }, " (you)") : null),
    h("td", { class: "usage" }, `${num(user.usage_device_s / 3600, 3)} h`),
    h("td", { class: "running" }, ofQuota(user.running_devices, user.max_running_devices)),
    h("td", { class: "queued" }, ofQuota(user.queued_jobs, user.max_queued_jobs)),
  );
}

/** "2 / 4"; "2 / no limit" where the quota is null. */
function ofQuota(value, quota) {
  return `${value} / ${quota === null || quota === undefined ? "no limit" : quota}`;
}

/** The audit trail's section and its refresh (admins only: the API refuses others). */
function auditPart(actor, offset) {
  const rows = h("tbody");
  const total = h("span", { class: "muted", id: "audit-total" });
  const pager = h("span", { class: "pager" });
  const table = h(
    "table",
    { class: "jobs audit", id: "audit", "data-loaded": "" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["When", "Who", "What", "Target", "Detail"].map((c) => h("th", {}, c)),
      ),
    ),
    rows,
  );
  const section = h(
    "section",
    { id: "audit-section" },
    h(
      "div",
      { class: "toolbar" },
      h("h3", {}, "Audit trail"),
      actor
        ? h("span", {}, `${actor}'s acts · `, h("a", { href: teamHash({}) }, "everyone's"))
        : null,
      total,
      h("span", { class: "grow" }),
      pager,
    ),
    table,
  );

  async function refresh(signal) {
    const query = new URLSearchParams({ limit: AUDIT_PAGE_SIZE, offset });
    if (actor) query.set("actor", actor);
    let got;
    try {
      got = await api.get(`/audit?${query}`, { signal });
    } catch (err) {
      // No longer an admin (changed since /me was read): the part goes, not an error box.
      if (err.status === 403) {
        section.remove();
        return;
      }
      throw err;
    }
    fill(
      rows,
      got.items.length
        ? got.items.map(auditRow)
        : h("tr", {}, h("td", { colspan: 5, class: "muted" }, "Nothing recorded.")),
    );
    fill(total, `${got.total} event${got.total === 1 ? "" : "s"}`);
    fill(pager, pagerLinks(got, (offset) => teamHash({ actor, offset })));
    table.dataset.loaded = actor || "all";
  }
  return { section, refresh };
}

function auditRow(event) {
  const job = /^job (\d+)$/.exec(event.target);
  return h(
    "tr",
    { "data-audit-id": event.id, "data-action": event.action },
    h("td", {}, when(event.at)),
    h("td", { class: "actor" }, h("a", { href: teamHash({ actor: event.actor }) }, event.actor)),
    h("td", { class: "action" }, event.action.replaceAll("_", " ")),
    h(
      "td",
      { class: "target" },
      job ? h("a", { href: `#/jobs/${job[1]}` }, event.target) : event.target,
    ),
    h("td", { class: "detail" }, event.detail ? h("code", {}, JSON.stringify(event.detail)) : ""),
  );
}

const teamHash = (filters) => viewHash("team", filters);
