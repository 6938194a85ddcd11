// A job's metric points from GET /jobs/{id}/metrics, every page of them, and the colours
// the views that draw several jobs at once give them.

import { api } from "./api.js";

// The API's own most per request.
const PAGE = 10_000;
// Distinct at a glance for the first ten; more jobs than that take evenly spread hues.
const PALETTE = [
  "#2563eb",
  "#dc2626",
  "#16a34a",
  "#9333ea",
  "#ea580c",
  "#0891b2",
  "#ca8a04",
  "#db2777",
  "#4b5563",
  "#65a30d",
];

/**
 * Every point {step, epoch, name, value, time} of a job after ``afterStep``, of one
 * metric (``name``) or all, by step.
 */
export async function metricsOf(jobId, { name = null, afterStep = -1, signal } = {}) {
  const points = [];
  for (let after = afterStep; ;) {
    const query = new URLSearchParams({ after_step: after, limit: PAGE });
    if (name !== null) query.set("name", name);
    const page = await api.get(`/jobs/${jobId}/metrics?${query}`, { signal });
    if (page.length < PAGE) {
      points.push(...page);
      return points;
    }
    // A full page may stop halfway through a step's metrics: keep the whole steps and
    // read the cut one again with the next page.
    const cut = page[page.length - 1].step;
    const whole = page.filter((p) => p.step < cut);
    if (!whole.length) throw new Error(`job ${jobId}: more than ${PAGE} points at step ${cut}`);
    points.push(...whole);
    after = cut - 1;
  }
}

/** The i-th of n colours. */
export function colourOf(i) {
  if (i < PALETTE.length) return PALETTE[i];
  return `hsl(${Math.round((i * 137.5) % 360)} 65% 45%)`; // the golden angle: far apart
}
