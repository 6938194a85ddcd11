// A sweep's trials as a table: a row per trial (the best marked), sortable by any column
// by clicking its header (again: the other way round; empty values always last), and a
// tick per row to pick trials for the compare view.

import { fill, fraction, h, num, progressBar, statusBadge } from "./dom.js";

/** A trial's status as shown and sorted: "pruned" for one the pruner stopped. */
export function trialStatus(trial) {
  return trial.pruned ? "pruned" : trial.status;
}

/** Numbers before text, each in its own order; null and undefined are left to the caller. */
function compareValues(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  if (typeof a === "number") return -1;
  if (typeof b === "number") return 1;
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

export class TrialTable {
  /** parameters: the names searched; metric: the sweep's, named in the headers. */
  constructor(parameters, metric) {
    this.sort = { key: "number", desc: false };
    this.ticked = new Set(); // trial numbers
    this.trials = [];
    this.best = null;
    this.columns = [
      { key: "number", label: "#", value: (t) => t.number },
      { key: "status", label: "status", value: trialStatus },
      ...parameters.map((name) => ({
        key: `values.${name}`,
        label: name,
        value: (t) => t.values[name],
        num: true,
      })),
      { key: "last", label: `last ${metric}`, value: (t) => t.last, num: true },
      { key: "best", label: `best ${metric}`, value: (t) => t.best, num: true },
      {
        key: "progress",
        label: "progress",
        value: (t) => (t.status === "succeeded" ? 1 : fraction(t.progress)),
      },
      { key: "job", label: "job", value: (t) => t.job_id },
    ];
    this.all = h("input", {
      type: "checkbox",
      id: "tick-all-trials",
      "aria-label": "Tick every trial",
    });
    this.all.addEventListener("change", () => {
      this.ticked = new Set(this.all.checked ? this.trials.map((t) => t.number) : []);
      this.draw();
      this.onTick();
    });
    this.head = h("tr");
    this.body = h("tbody");
    this.body.addEventListener("change", (event) => {
      const box = event.target;
      if (!box.classList.contains("tick")) return;
      const n = Number(box.value);
      if (box.checked) this.ticked.add(n);
      else this.ticked.delete(n);
      this.onTick();
    });
    this.table = h(
      "table",
      { class: "jobs trials", id: "trials" },
      h("thead", {}, this.head),
      this.body,
    );
    this.onTick = () => {};
  }

  /** The job ids of the ticked trials, by trial number. */
  tickedJobs() {
    return this.trials
      .filter((t) => this.ticked.has(t.number) && t.job_id !== null)
      .map((t) => t.job_id);
  }

  set(trials, bestNumber) {
    this.trials = trials;
    this.best = bestNumber;
    this.draw();
  }

  sortBy(key) {
    this.sort = { key, desc: this.sort.key === key ? !this.sort.desc : false };
    this.draw();
  }

  draw() {
    const { key, desc } = this.sort;
    // The headers only when the order changed: a poll's redraw must not swap the button
    // under a click.
    if (this.head.dataset.sort !== `${key}:${desc}`) this.drawHead();
    const column = this.columns.find((c) => c.key === key) ?? this.columns[0];
    const rows = [...this.trials].sort((a, b) => {
      const [va, vb] = [column.value(a), column.value(b)];
      const none = (va === null || va === undefined) - (vb === null || vb === undefined);
      if (none) return none; // empty last either way
      const order = va === null || va === undefined ? 0 : compareValues(va, vb);
      return (desc ? -order : order) || a.number - b.number;
    });
    fill(
      this.body,
      rows.length
        ? rows.map((t) => this.row(t))
        : h(
            "tr",
            {},
            h("td", { colspan: this.columns.length + 1, class: "muted" }, "No trials yet."),
          ),
    );
    this.all.checked = this.trials.length > 0 && this.ticked.size === this.trials.length;
    this.table.dataset.sort = `${key}:${desc ? "desc" : "asc"}`;
  }

  drawHead() {
    const { key, desc } = this.sort;
    fill(
      this.head,
      h("th", { class: "tick" }, this.all),
      this.columns.map((c) => {
        const sorted = c.key === key;
        const button = h(
          "button",
          { type: "button", class: "sort", "data-sort-key": c.key },
          c.label,
          h("span", { class: "arrow", "aria-hidden": "true" }, sorted ? (desc ? " ▼" : " ▲") : ""),
        );
        button.addEventListener("click", () => this.sortBy(c.key));
        return h(
          "th",
          {
            class: c.num ? "num" : null,
            "aria-sort": sorted ? (desc ? "descending" : "ascending") : null,
            "data-key": c.key,
          },
          button,
        );
      }),
    );
    this.head.dataset.sort = `${key}:${desc}`;
  }

  row(t) {
    const best = t.number === this.best;
    const status = trialStatus(t);
    const p = t.progress;
    // a trial whose spec was refused has no job
    const job = (text) => (t.job_id === null ? text : h("a", { href: `#/jobs/${t.job_id}` }, text));
    return h(
      "tr",
      {
        class: best ? "best" : null,
        "data-trial": t.number,
        "data-job-id": t.job_id,
        "data-status": status,
        "data-best": best ? "true" : null,
      },
      h(
        "td",
        { class: "tick" },
        h("input", {
          type: "checkbox",
          class: "tick",
          value: t.number,
          checked: this.ticked.has(t.number),
          "aria-label": `Tick trial ${t.number}`,
        }),
      ),
      h(
        "td",
        { class: "number" },
        job(String(t.number)),
        best ? h("span", { class: "best-mark", title: "The best trial so far" }, "★ best") : null,
      ),
      h(
        "td",
        { title: t.reason ? `${t.reason.code}: ${t.reason.message}` : null },
        statusBadge(status),
      ),
      this.columns
        .filter((c) => c.key.startsWith("values."))
        .map((c) => h("td", { class: "value" }, shown(c.value(t)))),
      h(
        "td",
        { class: "value", title: t.step === null ? null : `at step ${t.step}` },
        num(t.last, 5),
      ),
      h("td", { class: "value" }, num(t.best, 5)),
      h(
        "td",
        { class: "progress-cell" },
        progressBar(p, t.status),
        p ? h("small", {}, `epoch ${p.epoch}/${p.epochs}`) : null,
      ),
      h("td", {}, t.job_id === null ? "–" : job(`job ${t.job_id}`)),
    );
  }
}

function shown(value) {
  if (value === null || value === undefined) return "–";
  return typeof value === "number" ? num(value, 4) : String(value);
}
