// A sweep's trials in parallel coordinates, drawn as SVG: an axis per parameter and a
// last one for the metric, a line per trial through its values, coloured by its metric
// (the darkest the best). Ranges come from the sweep's spec: a parameter with log: true
// on a log axis, a categorical one's values spaced evenly in the order given. The
// metric's axis has the better values at the top, whichever the mode.

import { num } from "./dom.js";

const NS = "http://www.w3.org/2000/svg";
const HEIGHT_PX = 300;
const MARGIN = { top: 40, right: 90, bottom: 16, left: 70 };
const MAX_LABELS = 12; // a categorical axis with more values names every k-th
// Viridis from its yellow-green to its purple: better is darker, none too pale on white.
const RAMP = ["#b5de2b", "#35b779", "#26828e", "#3e4989", "#440154"];
const NO_VALUE = "#9ca3af";

/** The ramp's colour at t in [0, 1] (1: the best). */
export function rampColour(t) {
  const x = Math.min(1, Math.max(0, t)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(x));
  const [a, b] = [RAMP[i], RAMP[i + 1]].map((c) =>
    [1, 3, 5].map((k) => parseInt(c.slice(k, k + 2), 16)),
  );
  const mix = a.map((v, k) => Math.round(v + (b[k] - v) * (x - i)));
  return `rgb(${mix.join(" ")})`;
}

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs))
    if (v !== null && v !== undefined) el.setAttribute(k, v);
  el.append(...children.filter((c) => c !== null && c !== undefined));
  return el;
}

/** The metric value a trial is placed and coloured by: its last, which is what the sweep
 * ranks trials by (its best trial is the one that ended best), else its best so far. */
export function scoreOf(trial) {
  return trial.last ?? trial.best ?? null;
}

/** An axis: where a value sits (0 bottom .. 1 top, null: not placeable) and its ticks. */
function axisOf(name, spec, values) {
  if (spec?.type === "categorical" || (!spec && values.some((v) => typeof v !== "number"))) {
    const choices = (
      spec?.values ?? [...new Set(values.map((v) => JSON.stringify(v)))].map((v) => JSON.parse(v))
    ).map((v) => JSON.stringify(v));
    const at = (v) => {
      const i = choices.indexOf(JSON.stringify(v));
      if (i < 0) return null;
      return (i + 0.5) / choices.length; // evenly, half a gap from either end
    };
    const every = Math.ceil(choices.length / MAX_LABELS);
    const ticks = choices
      .filter((_, i) => i % every === 0)
      .map((c) => [at(JSON.parse(c)), label(JSON.parse(c))]);
    return { name, at, ticks, kind: "categorical" };
  }
  const numbers = values.filter((v) => typeof v === "number");
  let lo = Math.min(spec?.low ?? Infinity, ...numbers);
  let hi = Math.max(spec?.high ?? -Infinity, ...numbers);
  const log = Boolean(spec?.log) && lo > 0;
  if (!isFinite(lo) || !isFinite(hi)) [lo, hi] = [0, 1];
  if (lo === hi) [lo, hi] = [lo - 1, hi + 1];
  const f = log ? Math.log10 : (v) => v;
  const at = (v) =>
    typeof v === "number" && (!log || v > 0) ? (f(v) - f(lo)) / (f(hi) - f(lo)) : null;
  return {
    name,
    at,
    ticks: tickValues(lo, hi, log).map((v) => [at(v), num(v, 3)]),
    kind: log ? "log" : "linear",
  };
}

/** A colour per trial number, by its score as the metric's axis places it. */
export function trialColours(trials, mode) {
  const at = metricAxis("", mode, trials.map(scoreOf)).at;
  return new Map(
    trials.map((t) => [t.number, scoreOf(t) === null ? NO_VALUE : rampColour(at(scoreOf(t)))]),
  );
}

/** The metric's axis: better values at the top; on a log scale when its values are all
 * positive and span a decade or more (a loss that fell a long way: else one bad trial
 * squeezes the rest into one colour). */
function metricAxis(name, mode, scores) {
  const known = scores.filter((v) => v !== null);
  let lo = known.length ? Math.min(...known) : 0;
  let hi = known.length ? Math.max(...known) : 1;
  if (lo === hi) [lo, hi] = [lo - Math.abs(lo || 1) * 0.1, hi + Math.abs(hi || 1) * 0.1];
  const log = lo > 0 && hi / lo >= 10;
  const f = log ? Math.log10 : (v) => v;
  const up = (v) => (f(v) - f(lo)) / (f(hi) - f(lo));
  const at = (v) => (v === null ? null : mode === "max" ? up(v) : 1 - up(v));
  const ticks = known.length ? tickValues(lo, hi, log).map((v) => [at(v), num(v, 3)]) : [];
  return { name, title: `last ${name}`, at, ticks, kind: "metric", log };
}

function tickValues(lo, hi, log) {
  if (log) {
    const ticks = [lo];
    for (let p = Math.ceil(Math.log10(lo)); 10 ** p < hi; p++)
      if (10 ** p > lo) ticks.push(10 ** p);
    ticks.push(hi);
    // a range under two decades: a mid point as well
    return ticks.length > 2 ? ticks : [lo, Math.sqrt(lo * hi), hi];
  }
  return [0, 1, 2, 3, 4].map((k) => lo + ((hi - lo) * k) / 4);
}

function label(v) {
  return typeof v === "number" ? num(v, 4) : String(v);
}

export class ParallelCoordinates {
  /** el must already be in the document: the drawing is as wide as it is. */
  constructor(el) {
    this.el = el;
    this.data = null;
    this.width = 0;
    this.resize = new ResizeObserver(() => {
      if (this.data && this.el.clientWidth !== this.width) this.draw();
    });
    this.resize.observe(el);
  }

  /** Draw {parameters (the spec's), metric, mode, trials, bestNumber}. */
  set(data) {
    this.data = data;
    this.draw();
  }

  draw() {
    const { parameters, metric, mode, trials, bestNumber } = this.data;
    this.width = this.el.clientWidth || 800;
    const names = Object.keys(parameters);
    const scores = trials.map(scoreOf);
    const axes = [
      ...names.map((n) =>
        axisOf(
          n,
          parameters[n],
          trials.map((t) => t.values[n]),
        ),
      ),
      metricAxis(metric, mode, scores),
    ];
    const inner = {
      w: this.width - MARGIN.left - MARGIN.right,
      h: HEIGHT_PX - MARGIN.top - MARGIN.bottom,
    };
    const x = (i) =>
      MARGIN.left + (axes.length === 1 ? inner.w / 2 : (inner.w * i) / (axes.length - 1));
    const y = (pos) => MARGIN.top + (1 - pos) * inner.h;
    const metricPos = axes[axes.length - 1].at;

    const lines = trials
      .map((t, k) => [t, scores[k]])
      // the best last, so it is drawn over the rest; the ones with no value first
      .sort(
        ([a, sa], [b, sb]) =>
          (a.number === bestNumber) - (b.number === bestNumber) || (sa !== null) - (sb !== null),
      )
      .map(([t, score]) => {
        const points = [];
        axes.forEach((axis, i) => {
          const pos = i < names.length ? axis.at(t.values[axis.name]) : axis.at(score);
          if (pos !== null) points.push(`${x(i).toFixed(1)},${y(pos).toFixed(1)}`);
        });
        const best = t.number === bestNumber;
        const colour = score === null ? NO_VALUE : rampColour(metricPos(score));
        const title = [
          `trial ${t.number}${best ? " (best)" : ""} · job ${t.job_id}`,
          ...names.map((n) => `${n} = ${label(t.values[n])}`),
          `${metric} = ${score === null ? "–" : num(score, 6)}`,
        ].join("\n");
        return svg(
          "a",
          { href: t.job_id === null ? null : `#/jobs/${t.job_id}` },
          svg(
            "polyline",
            {
              points: points.join(" "),
              stroke: colour,
              class: ["trial", best ? "best" : null, score === null ? "no-value" : null]
                .filter(Boolean)
                .join(" "),
              "data-trial": t.number,
            },
            svg("title", {}, title),
          ),
        );
      });

    const drawn = axes.map((axis, i) => {
      const metricOne = axis.kind === "metric";
      // the metric's ticks on its right: the lines come in from the left
      const side = metricOne ? 1 : -1;
      const note = metricOne
        ? `${axis.log ? "log · " : ""}${mode} · better ↑`
        : axis.kind === "log"
          ? "log"
          : null;
      return svg(
        "g",
        { class: `axis ${axis.kind}`, transform: `translate(${x(i)},0)`, "data-axis": axis.name },
        // the metric's axis is drawn as the colour scale: what the lines' colours mean
        metricOne
          ? svg("rect", {
              class: "ramp",
              x: -3,
              y: y(1),
              width: 6,
              height: inner.h,
              fill: "url(#parallel-ramp)",
            })
          : svg("line", { x1: 0, x2: 0, y1: y(0), y2: y(1) }),
        svg(
          "text",
          { class: "axis-name", x: 0, y: MARGIN.top - 22, "text-anchor": "middle" },
          axis.title ?? axis.name,
        ),
        note
          ? svg(
              "text",
              { class: "axis-note", x: 0, y: MARGIN.top - 9, "text-anchor": "middle" },
              note,
            )
          : null,
        ...axis.ticks.map(([pos, text]) =>
          svg(
            "g",
            { class: "tick", transform: `translate(0,${y(pos).toFixed(1)})` },
            svg("line", { x1: 4 * side, x2: 0 }),
            svg(
              "text",
              { x: 7 * side, dy: "0.32em", "text-anchor": side > 0 ? "start" : "end" },
              text,
            ),
          ),
        ),
      );
    });
    const gradient = svg(
      "linearGradient",
      // the metric's axis runs from worst (bottom) to best (top), as the ramp
      { id: "parallel-ramp", x1: 0, x2: 0, y1: 1, y2: 0 },
      ...RAMP.map((c, i) => svg("stop", { offset: i / (RAMP.length - 1), "stop-color": c })),
    );
    const picture = svg(
      "svg",
      {
        class: "parallel",
        width: this.width,
        height: HEIGHT_PX,
        viewBox: `0 0 ${this.width} ${HEIGHT_PX}`,
        role: "img",
        "aria-label": `Parameters of ${trials.length} trials against ${metric}`,
        "data-axes": axes.length,
        "data-lines": lines.length,
      },
      svg("defs", {}, gradient),
      svg("g", { class: "lines" }, ...lines),
      ...drawn,
    );
    this.el.replaceChildren(picture);
  }

  destroy() {
    this.resize.disconnect();
  }
}
