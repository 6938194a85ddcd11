// Train and validation loss against step, drawn by the vendored uPlot (a classic
// script: window.uPlot). uPlot wants one shared x array, so both series are kept
// aligned on the union of their steps, with nulls where a series has no point.

const SERIES = { "train/loss": 1, "val/loss": 2 };
const HEIGHT_PX = 280;

const fmt = (_u, v) => (v === null || v === undefined ? "–" : v.toPrecision(4));

export class LossChart {
  /** el must already be in the document: uPlot sizes itself from it. */
  constructor(el) {
    this.el = el;
    this.data = [[], [], []]; // steps, train/loss, val/loss
    this.index = new Map(); // step -> position in the arrays
    this.counts = [0, 0, 0];
    this.frame = 0;
    this.plot = new window.uPlot(
      {
        width: el.clientWidth || 600,
        height: HEIGHT_PX,
        scales: { x: { time: false } },
        series: [
          { label: "step" },
          { label: "train/loss", stroke: "#2563eb", width: 1.5, spanGaps: true, value: fmt },
          {
            label: "val/loss",
            stroke: "#dc2626",
            width: 2,
            spanGaps: true, // one point per epoch: join them
            points: { show: true, size: 6 },
            value: fmt,
          },
        ],
        axes: [{ label: "step" }, { label: "loss" }],
      },
      this.data,
      el,
    );
    this.resize = new ResizeObserver(() => {
      if (el.clientWidth) this.plot.setSize({ width: el.clientWidth, height: HEIGHT_PX });
    });
    this.resize.observe(el);
    this.publish();
  }

  /** Take a metric event {step, name, value}; names other than the two losses are ignored. */
  add({ step, name, value }) {
    const series = SERIES[name];
    if (series === undefined) return;
    const i = this.position(step);
    if (this.data[series][i] === null) this.counts[series] += 1;
    this.data[series][i] = value;
    // A replay brings thousands of points at once: draw once per frame.
    this.frame ||= requestAnimationFrame(() => {
      this.frame = 0;
      this.plot.setData(this.data);
      this.publish();
    });
  }

  position(step) {
    let i = this.index.get(step);
    if (i !== undefined) return i;
    const steps = this.data[0];
    i = steps.length;
    if (i && steps[i - 1] > step) {
      // Out of order (rare: points arrive by step). Insert and renumber what follows.
      i = steps.findIndex((s) => s > step);
      for (let j = i; j < steps.length; j++) this.index.set(steps[j], j + 1);
    }
    for (const column of this.data) column.splice(i, 0, null);
    steps[i] = step;
    this.index.set(step, i);
    return i;
  }

  /** Point counts on the element, for people's devtools and the browser test. */
  publish() {
    this.el.dataset.points = this.counts[1] + this.counts[2];
    this.el.dataset.trainPoints = this.counts[1];
    this.el.dataset.valPoints = this.counts[2];
  }

  destroy() {
    cancelAnimationFrame(this.frame);
    this.resize.disconnect();
    this.plot.destroy();
  }
}
