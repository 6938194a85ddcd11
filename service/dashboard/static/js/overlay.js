// One metric of several jobs on one chart (the compare view, a sweep's trials), drawn by
// the vendored uPlot (window.uPlot). uPlot wants one shared x array, so the curves are
// aligned on the union of their steps, with nulls where a curve has no point there.

import { STEP_INCRS, yAxisWidth } from "./chart.js";
import { h } from "./dom.js";

const HEIGHT_PX = 320;
const WIDTH = { normal: 1.5, emphasised: 3.5 };
const DIMMED = 0.45; // the others' opacity beside an emphasised curve

const fmt = (_u, v) => (v === null || v === undefined ? "–" : v.toPrecision(4));

export class OverlayChart {
  /** el must already be in the document: the chart sizes itself from it. */
  constructor(el, { height = HEIGHT_PX } = {}) {
    this.height = height;
    this.plot = null;
    this.shape = ""; // the series the plot was built with: rebuilt when they change
    this.box = h("div", { class: "plot" });
    this.el = el;
    el.replaceChildren(this.box);
    el.dataset.series = 0;
    el.dataset.points = 0;
    this.resize = new ResizeObserver(() => {
      if (this.plot && this.box.clientWidth) {
        this.plot.setSize({ width: this.box.clientWidth, height: this.height });
      }
    });
    this.resize.observe(this.box);
  }

  /**
   * Draw ``curves``: [{key, label, colour, emphasised, points: [[step, value], …]}]; an
   * emphasised curve is drawn thick and on top, the others fainter. ``logY``: the values
   * on a log scale, if they are all positive.
   */
  set(curves, { xLabel = "step", logY = false } = {}) {
    const any = curves.some((c) => c.emphasised);
    // the emphasised last, so it is drawn over the rest
    const ordered = [...curves].sort((a, b) => Boolean(a.emphasised) - Boolean(b.emphasised));
    const steps = [...new Set(ordered.flatMap((c) => c.points.map(([s]) => s)))].sort(
      (a, b) => a - b,
    );
    const at = new Map(steps.map((s, i) => [s, i]));
    const columns = ordered.map((c) => {
      const column = steps.map(() => null);
      for (const [s, v] of c.points) column[at.get(s)] = v;
      return column;
    });
    const data = [steps, ...columns];
    this.el.dataset.series = curves.length;
    this.el.dataset.points = curves.reduce((n, c) => n + c.points.length, 0);
    if (!curves.length) {
      // no chart at all: the box says why (app.css)
      this.plot?.destroy();
      this.plot = null;
      this.shape = "";
      return;
    }
    const log = logY && curves.every((c) => c.points.every(([, v]) => v > 0));
    const shape = JSON.stringify([
      xLabel,
      log,
      ordered.map((c) => [c.key, c.label, c.colour, c.emphasised]),
    ]);
    if (shape === this.shape && this.plot) {
      this.plot.setData(data);
    } else {
      this.plot?.destroy();
      this.plot = new window.uPlot(this.options(ordered, any, xLabel, log), data, this.box);
      this.shape = shape;
    }
    this.el.dataset.log = String(log);
  }

  options(curves, any, xLabel, log) {
    const series = curves.map((c) => ({
      label: c.label,
      stroke: c.colour,
      width: c.emphasised ? WIDTH.emphasised : WIDTH.normal,
      alpha: any && !c.emphasised ? DIMMED : 1,
      spanGaps: true, // a point an epoch: join them
      value: fmt,
      points: { size: 5, show: c.points.length < 40 },
    }));
    return {
      width: this.box.clientWidth || 600,
      height: this.height,
      scales: { x: { time: false }, y: { distr: log ? 3 : 1 } },
      series: [{ label: xLabel }, ...series],
      axes: [{ label: xLabel, incrs: STEP_INCRS }, { size: yAxisWidth }],
    };
  }

  destroy() {
    this.resize.disconnect();
    this.plot?.destroy();
  }
}
