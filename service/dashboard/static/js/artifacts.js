// A job's files (its model, resolved spec, checkpoints, what a script wrote), with sizes
// and a link each. A download goes through fetch() with the token in the Authorization
// header, as every other request of the page: a plain link cannot send the header, and a
// token in a URL would land in the server's access log and the browser's history. The
// browser keeps the body as a Blob (on disk when it is large) and saves it under the
// file's own name.

import { ApiError, api, apiUrl, authorizedFetch } from "./api.js";
import { fill, h } from "./dom.js";

// While a job runs, its list is read again at most this often (checkpoints appear).
const RUNNING_REFRESH_MS = 10_000;
// The object URL is freed once the browser has surely taken the file over.
const REVOKE_AFTER_MS = 60_000;

export class ArtifactList {
  /** el: the card's table body holder; notice: where a failed download says why. */
  constructor(el, notice, jobId, signal) {
    this.el = el;
    this.notice = notice;
    this.jobId = jobId;
    this.signal = signal;
    this.reads = 0;
    this.lastRead = 0;
  }

  /** Read the list again: at once, or (``running``) unless it was read a moment ago. */
  refresh({ running = false } = {}) {
    if (running && performance.now() - this.lastRead < RUNNING_REFRESH_MS) return;
    this.lastRead = performance.now();
    const mine = ++this.reads;
    api
      .get(`/jobs/${this.jobId}/artifacts`, { signal: this.signal })
      .then((files) => {
        if (mine === this.reads) this.render(files);
      })
      .catch(() => {}); // the page's own notice already says when the API is away
  }

  render(files) {
    this.el.dataset.count = files.length;
    if (!files.length) {
      fill(this.el, h("p", { class: "muted" }, "No artifacts yet."));
      return;
    }
    const rows = files.map(({ name, size }) => {
      const url = apiUrl(`/jobs/${this.jobId}/artifacts/${encodePath(name)}`);
      const link = h("a", { href: url, download: baseName(name) }, name);
      const state = h("span", { class: "muted download-state" });
      link.addEventListener("click", (event) => {
        event.preventDefault(); // the link has no token to send
        this.download(url, name, size, link, state);
      });
      return h(
        "tr",
        { "data-name": name, "data-size": size },
        h("td", { class: "name" }, link, " ", state),
        h("td", { class: "size", title: `${size} bytes` }, bytes(size)),
      );
    });
    fill(
      this.el,
      h(
        "table",
        { class: "artifacts", id: "artifacts-table" },
        h("thead", {}, h("tr", {}, h("th", {}, "File"), h("th", {}, "Size"))),
        h("tbody", {}, rows),
      ),
    );
  }

  async download(url, name, size, link, state) {
    if (link.dataset.state === "downloading") return;
    link.dataset.state = "downloading";
    fill(this.notice, "");
    fill(state, "downloading…");
    try {
      const response = await authorizedFetch(url, { signal: this.signal });
      if (!response.ok) {
        const body = await response.json().catch(() => null);
        throw new ApiError(response.status, body?.detail ?? response.statusText);
      }
      let received = 0;
      const counted = response.body.pipeThrough(
        new TransformStream({
          transform(chunk, controller) {
            received += chunk.byteLength;
            if (size) fill(state, `${Math.floor((received / size) * 100)}%`);
            controller.enqueue(chunk);
          },
        }),
      );
      const blob = await new Response(counted).blob();
      const saving = URL.createObjectURL(blob);
      const anchor = h("a", { href: saving, download: baseName(name), hidden: true });
      document.body.append(anchor);
      anchor.click();
      anchor.remove();
      setTimeout(() => URL.revokeObjectURL(saving), REVOKE_AFTER_MS);
      link.dataset.state = "saved";
      fill(state, "");
    } catch (err) {
      if (this.signal.aborted) return;
      link.dataset.state = "failed";
      fill(state, "");
      fill(this.notice, `Could not download ${name}: ${err.message}`);
      if (err.status === 404) this.refresh(); // gone since the list was read
    }
  }
}

/** Each part of a path encoded on its own: "eval/per class.csv" -> "eval/per%20class.csv". */
function encodePath(name) {
  return name.split("/").map(encodeURIComponent).join("/");
}

function baseName(name) {
  return name.slice(name.lastIndexOf("/") + 1);
}

/** 1536 -> "1.5 KiB". */
function bytes(n) {
  const units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  if (i === 0) return n === 1 ? "1 byte" : `${n} bytes`;
  return `${n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
}
