// Small DOM and formatting helpers. Everything a job carries (names, log lines, errors)
// is user content, so the views build nodes with textContent and never use innerHTML.

/** h("a", {href: "#/jobs", class: "x"}, "text", childNode) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  el.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
export const STATUSES = ["queued", "running", "cancelling", "succeeded", "failed", "cancelled"];

export function statusBadge(status) {
  return h("span", { class: `badge status-${status}`, "data-status": status }, status);
}

/** A bar for progress {step, total_steps}; null progress shows an empty bar. */
export function progressBar(progress, status) {
  const done = status === "succeeded" ? 1 : fraction(progress);
  const pct = Math.round(done * 1000) / 10;
  const bar = h("div", {
    class: "bar",
    role: "progressbar",
    "aria-valuemin": 0,
    "aria-valuemax": 100,
    "aria-valuenow": pct,
  });
  bar.append(h("div", { class: "fill", style: `width: ${pct}%` }));
  return bar;
}

export function fraction(progress) {
  if (!progress || !progress.total_steps) return 0;
  return Math.min(1, progress.step / progress.total_steps);
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "–";
}

export function num(value, digits = 4) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  // Round for reading, then drop the zeros toPrecision pads with (0.0100000 -> 0.01).
  return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(digits)));
}

/** Replace the children of el. */
export function fill(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
  return el;
}

/** "#/ROUTE?name=value&…" with the filters given that are set (none: "#/ROUTE"). */
export function viewHash(route, filters) {
  const query = new URLSearchParams(Object.entries(filters).filter(([, v]) => v)).toString();
  return query ? `#/${route}?${query}` : `#/${route}`;
}

/** A listing's "‹ newer 51–100 older ›" links; ``at(offset)`` is the page's address. */
export function pagerLinks(page, at) {
  const last = Math.min(page.offset + page.items.length, page.total);
  return [
    page.offset > 0 ? h("a", { href: at(Math.max(0, page.offset - page.limit)) }, "‹ newer") : null,
    page.total > page.limit ? h("span", {}, ` ${page.offset + 1}–${last} `) : null,
    last < page.total ? h("a", { href: at(page.offset + page.limit) }, "older ›") : null,
  ];
}
