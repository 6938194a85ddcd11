// Every metric a job reported, against step, drawn by the vendored uPlot (a classic
// script: window.uPlot). Metrics are grouped by the last part of their name: every loss
// ("train/loss", "val/loss", "train/epoch_loss") on one chart, each other kind on a
// chart and axis of its own ("val/accuracy" beside "train/accuracy"; "train/lr" alone).
// A chart and its series appear with their first point, so a legend names only what
// the job reported. uPlot wants one shared x array per chart, so a chart's series are
// kept aligned on the union of their steps, with nulls where a series has no point.

import { h } from "./dom.js";

const LOSS = "loss";
const HEIGHT_PX = { [LOSS]: 280, other: 200 };
// The usual pair keeps its usual colours; other series take the palette's free ones.
const COLOURS = { "train/loss": "#2563eb", "val/loss": "#dc2626" };
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563"];
// A series with fewer points than one per this many CSS pixels shows each as a dot
// (one point an epoch, say).
const SPARSE_PX = 12;

// Steps are whole: the x axis ticks at 1, 2, 5, 10, 20 … apart, never at 2.2.
export const STEP_INCRS = Array.from(
  { length: 30 },
  (_, i) => [1, 2, 5][i % 3] * 10 ** Math.floor(i / 3),
);

const fmt = (_u, v) => (v === null || v === undefined ? "–" : v.toPrecision(4));

/** The chart a metric is drawn on: "loss" for any loss ("loss", "train/epoch_loss"; not
 * "amp/loss_scale", which is no loss), else its name's last part. */
export function groupOf(name) {
  const last = name.slice(name.lastIndexOf("/") + 1);
  if (/(^|[_.-])loss$/i.test(last)) return LOSS;
  return last || name;
}

/** The loss chart first, then the others by name: the same order live and on replay. */
function before(a, b) {
  return (b === LOSS) - (a === LOSS) || a.localeCompare(b);
}

/** A colour per series: the usual pair's own, then the palette's not yet taken. */
function coloursOf(names) {
  const taken = new Set(names.map((n) => COLOURS[n]).filter(Boolean));
  const free = PALETTE.filter((c) => !taken.has(c));
  let next = 0;
  return new Map(names.map((n) => [n, COLOURS[n] ?? free[next++ % free.length]]));
}

/** The y axis as wide as its longest tick label (uPlot sizes axes in a few passes). */
export function yAxisWidth(u, values, axisIdx, cycleNum) {
  const axis = u.axes[axisIdx];
  if (cycleNum > 1) return axis._size; // settle: the ticks' width no longer changes
  const labels = (values ?? []).map(String);
  const longest = labels.reduce((a, v) => (v.length > a.length ? v : a), "");
  u.ctx.font = axis.font[0];
  const text = longest ? u.ctx.measureText(longest).width / devicePixelRatio : 0;
  return Math.ceil(axis.ticks.size + axis.gap + text);
}

export class MetricCharts {
  /** el must already be in the document: each chart sizes itself from it. */
  constructor(el) {
    this.el = el;
    this.charts = new Map(); // group -> GroupChart
    this.frame = 0;
    this.publish();
  }

  /** Take a metric event {step, name, value}. */
  add({ step, name, value }) {
    const group = groupOf(name);
    let chart = this.charts.get(group);
    if (!chart) {
      chart = new GroupChart(group);
      const next = [...this.charts.keys()].sort(before).find((g) => before(group, g) < 0);
      this.el.insertBefore(chart.figure, next === undefined ? null : this.charts.get(next).figure);
      this.charts.set(group, chart);
    }
    chart.add(step, name, value);
    // A replay brings thousands of points at once: draw once per frame.
    this.frame ||= requestAnimationFrame(() => {
      this.frame = 0;
      for (const c of this.charts.values()) c.draw();
      this.publish();
    });
  }

  /** Point counts on the element, for people's devtools and the browser test. */
  publish() {
    let points = 0;
    for (const c of this.charts.values()) points += c.points();
    this.el.dataset.points = points;
    this.el.dataset.groups = JSON.stringify([...this.charts.keys()]);
  }

  destroy() {
    cancelAnimationFrame(this.frame);
    for (const c of this.charts.values()) c.destroy();
  }
}

/** One chart: the series of one group on one y axis. */
class GroupChart {
  constructor(group) {
    this.group = group;
    this.names = []; // series, by name
    this.steps = [];
    this.columns = new Map(); // name -> values aligned on steps
    this.counts = new Map(); // name -> points
    this.index = new Map(); // step -> position in the arrays
    this.plot = null;
    this.stale = true; // a series came since the plot was built
    this.box = h("div", { class: "plot" });
    this.figure = h(
      "figure",
      { class: "metric-chart", "data-group": group },
      h("figcaption", {}, group),
      this.box,
    );
    this.resize = new ResizeObserver(() => {
      if (this.plot && this.box.clientWidth) {
        this.plot.setSize({ width: this.box.clientWidth, height: this.height() });
      }
    });
    this.resize.observe(this.box);
  }

  add(step, name, value) {
    if (!this.columns.has(name)) {
      this.columns.set(name, this.steps.map(() => null));
      this.counts.set(name, 0);
      this.names = [...this.columns.keys()].sort();
      this.stale = true;
    }
    const i = this.position(step);
    const column = this.columns.get(name);
    if (column[i] === null) this.counts.set(name, this.counts.get(name) + 1);
    column[i] = value;
  }

  position(step) {
    let i = this.index.get(step);
    if (i !== undefined) return i;
    i = this.steps.length;
    if (i && this.steps[i - 1] > step) {
      // Out of order (rare: points arrive by step). Insert and renumber what follows.
      i = this.steps.findIndex((s) => s > step);
      for (let j = i; j < this.steps.length; j++) this.index.set(this.steps[j], j + 1);
    }
    this.steps.splice(i, 0, step);
    for (const column of this.columns.values()) column.splice(i, 0, null);
    this.index.set(step, i);
    return i;
  }

  data() {
    return [this.steps, ...this.names.map((n) => this.columns.get(n))];
  }

  height() {
    return HEIGHT_PX[this.group] ?? HEIGHT_PX.other;
  }

  /** Redraw; rebuilt (a handful of times a job) when a series joined, since uPlot's
   * legend and colours are set when it is made. */
  draw() {
    if (!this.stale) {
      this.plot.setData(this.data());
    } else {
      this.plot?.destroy();
      this.plot = new window.uPlot(this.options(), this.data(), this.box);
      this.stale = false;
    }
    this.figure.dataset.points = this.points();
    this.figure.dataset.counts = JSON.stringify(Object.fromEntries(this.counts));
  }

  options() {
    const counts = this.counts;
    const colours = coloursOf(this.names);
    const series = this.names.map((name) => ({
      label: name,
      stroke: colours.get(name),
      width: 1.5,
      spanGaps: true, // a point an epoch among a point a step: join them
      value: fmt,
      points: {
        size: 6,
        show: (u) => counts.get(name) * SPARSE_PX * devicePixelRatio < u.bbox.width,
      },
    }));
    return {
      width: this.box.clientWidth || 600,
      height: this.height(),
      scales: { x: { time: false } },
      series: [{ label: "step" }, ...series],
      // the caption names the y axis; its width follows its longest tick ("56,000")
      axes: [{ label: "step", incrs: STEP_INCRS }, { size: yAxisWidth }],
    };
  }

  points() {
    let n = 0;
    for (const c of this.counts.values()) n += c;
    return n;
  }

  destroy() {
    this.resize.disconnect();
    this.plot?.destroy();
  }
}
