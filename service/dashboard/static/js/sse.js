// A job's event stream, read with fetch(): EventSource cannot send the Authorization
// header a token-protected server needs. SseParser follows the WHATWG
// "event stream interpretation" rules; followEvents reconnects with Last-Event-ID.

import { ApiError, apiUrl, authorizedFetch } from "./api.js";

const BACKOFF_MS = [250, 500, 1000, 2000, 3000]; // then stays at the last

export class SseParser {
  constructor() {
    this.rest = ""; // an incomplete line carried to the next chunk
    this.idBuffer = "";
    this.lastEventId = ""; // set only when an event completes, as the spec says
    this.retryMs = null;
    this.type = "";
    this.data = [];
  }

  /** Feed decoded text; returns the events it completed: {type, data, id}. */
  feed(chunk) {
    let text = this.rest + chunk;
    // A chunk may end between the "\r" and "\n" of one line break: hold the "\r" back,
    // or the "\n" would read as a second, event-ending, empty line.
    const held = text.endsWith("\r") ? "\r" : "";
    if (held) text = text.slice(0, -1);
    const lines = text.split(/\r\n|\r|\n/);
    this.rest = lines.pop() + held;
    const events = [];
    for (const line of lines) {
      if (line === "") {
        const event = this.dispatch();
        if (event) events.push(event);
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        this.field(field, value);
      } // else a comment: the server's keep-alive
    }
    return events;
  }

  /** At the end of the stream: a held-back "\r" did end its line after all. */
  finish() {
    const rest = this.rest;
    this.rest = "";
    return rest.endsWith("\r") ? this.feed(`${rest.slice(0, -1)}\n`) : [];
  }

  field(name, value) {
    if (name === "event") this.type = value;
    else if (name === "data") this.data.push(value);
    else if (name === "id" && !value.includes("\0")) this.idBuffer = value;
    else if (name === "retry" && /^\d+$/.test(value)) this.retryMs = Number(value);
  }

  dispatch() {
    this.lastEventId = this.idBuffer;
    const event = {
      type: this.type || "message",
      data: this.data.join("\n"),
      id: this.lastEventId,
    };
    // Unlike the spec, an event with a type and no data line still counts: an `end`
    // marker may come without data.
    const empty = this.data.length === 0 && this.type === "";
    this.type = "";
    this.data = [];
    return empty ? null : event;
  }
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => clearTimeout(timer), { once: true });
  });
}

/**
 * Follow GET /api/v1{path} until its `end` event or until signal aborts, calling
 * onEvent(type, parsedData) for every event. A dropped connection is resumed after
 * the last event seen, with a short back-off. onState gets "live", "reconnecting",
 * "ended". Rejects only on a 4xx that a retry would not mend (the job does not exist).
 */
export async function followEvents(path, onEvent, { signal, onState = () => {} }) {
  let lastEventId = "";
  let failures = 0;
  let retryMs = null;
  while (!signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (lastEventId) headers["Last-Event-ID"] = lastEventId;
      const response = await authorizedFetch(apiUrl(path), { headers, signal, cache: "no-store" });
      if (gone(response.status)) {
        const body = await response.json().catch(() => null);
        throw new ApiError(response.status, body?.detail ?? response.statusText);
      }
      if (!response.ok) throw new Error(`event stream answered HTTP ${response.status}`);
      onState("live");
      const parser = new SseParser();
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        for (const event of done ? parser.finish() : parser.feed(value)) {
          failures = 0;
          lastEventId = parser.lastEventId;
          if (event.type === "end") {
            onState("ended");
            return;
          }
          deliver(onEvent, event);
        }
        retryMs = parser.retryMs ?? retryMs;
        if (done) break;
      }
      // Closed without `end`: a server restart or a proxy's timeout. Resume.
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof ApiError) throw err;
      console.warn("event stream interrupted:", err);
    }
    onState("reconnecting");
    const backoff = BACKOFF_MS[Math.min(failures, BACKOFF_MS.length - 1)];
    failures += 1;
    await pause(Math.max(backoff, retryMs ?? 0), signal);
  }
}

/** A 4xx that asking again will not mend (no such job): 408 and 429 are worth a retry. */
function gone(status) {
  return status >= 400 && status < 500 && status !== 408 && status !== 429;
}

function deliver(onEvent, event) {
  try {
    onEvent(event.type, event.data ? JSON.parse(event.data) : null);
  } catch (err) {
    // One bad event must not tear the stream down (and replay everything again).
    console.error(`could not handle ${event.type} event ${event.id}:`, err);
  }
}
