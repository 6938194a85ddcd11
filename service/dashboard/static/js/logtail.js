// The last MAX_LINES log lines of a job. A replay can bring a hundred thousand lines
// at once, so lines are buffered and drawn once per frame, and only the newest
// MAX_LINES of a burst ever become DOM nodes.

import { h } from "./dom.js";

export const MAX_LINES = 500;

export class LogTail {
  constructor(el, counter) {
    this.el = el;
    this.counter = counter;
    this.pending = [];
    this.lastSeq = 0;
    this.received = 0; // lines, not seq: seq numbers every event of the job, not just logs
    this.frame = 0;
  }

  /** Take a log event {seq, time, stream, text}. */
  add(line) {
    if (line.seq <= this.lastSeq) return; // already shown (a resumed stream may overlap)
    this.lastSeq = line.seq;
    this.received += 1;
    this.pending.push(line);
    if (this.pending.length > 2 * MAX_LINES) {
      this.pending.splice(0, this.pending.length - MAX_LINES); // the DOM would drop them anyway
    }
    this.frame ||= requestAnimationFrame(() => this.flush());
  }

  flush() {
    this.frame = 0;
    const el = this.el;
    // Follow the tail only if the reader is at the bottom, not while they scroll back.
    const following = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
    const fresh = this.pending.slice(-MAX_LINES).map(render);
    this.pending = [];
    el.append(...fresh);
    for (let extra = el.childElementCount - MAX_LINES; extra > 0; extra--) el.firstChild.remove();
    if (following) el.scrollTop = el.scrollHeight;
    const shown = el.childElementCount;
    this.counter.textContent =
      this.received > shown ? `last ${shown} of ${this.received} lines` : `${shown} lines`;
  }

  destroy() {
    cancelAnimationFrame(this.frame);
  }
}

function render({ seq, time, stream, text }) {
  const at = new Date(time * 1000).toLocaleTimeString([], { hour12: false });
  return h(
    "div",
    { class: `line stream-${stream}`, "data-seq": seq },
    h("span", { class: "at" }, at),
    h("span", { class: "text" }, text),
  );
}
