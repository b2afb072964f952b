// GET /v1/events read with fetch() and a ReadableStream (an EventSource cannot send
// the Authorization header), parsed as Server-Sent Events (docs/events.md).
//
// After a drop the stream reconnects with `Last-Event-ID` (the last `id:` seen: the
// log sequence), so no event is lost or repeated. An `event: error` with reason
// `slow` or `gone` ends the stream: then it starts again from the log's end and
// `onReset` re-fetches the tables.

import { Unauthorized, authHeaders, problemDetail, refused } from "./api.js";

/** The SSE wire format (html.spec.whatwg.org, "Server-sent events"), fed in chunks. */
export class SseParser {
  constructor(dispatch) {
    this.dispatch = dispatch;
    this.buffer = "";
    this.afterCR = false;
    this.reset();
  }

  reset() {
    this.data = [];
    this.event = "";
    this.id = undefined;
  }

  push(chunk) {
    let text = chunk;
    if (this.afterCR && text.startsWith("\n")) text = text.slice(1); // a CRLF split in two
    this.afterCR = text.endsWith("\r");
    this.buffer += text;
    const lines = this.buffer.split(/\r\n|\r|\n/);
    this.buffer = lines.pop();
    for (const line of lines) this.line(line);
  }

  line(line) {
    if (line === "") {
      if (this.data.length) this.dispatch({ event: this.event || "message", data: this.data.join("\n"), id: this.id });
      else if (this.id !== undefined) this.dispatch({ event: "", data: "", id: this.id });
      this.reset();
      return;
    }
    if (line.startsWith(":")) return; // a comment: the server's keep-alive
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.id = value;
  }
}

const RETRY_MIN_MS = 500;
const RETRY_MAX_MS = 10000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Follows /v1/events until stop(). Callbacks:
 *  onEvent(cloudEvent)  each CloudEvent, in log order;
 *  onOpen(after, fresh) the stream (re)started after sequence `after`; `fresh`: from
 *                       the log's end (first start, or after slow/gone), so the tables
 *                       must be (re)loaded;
 *  onStatus(state, why) "connecting" | "live" | "reconnecting".
 */
export class EventStream {
  constructor({ onEvent, onOpen, onStatus }) {
    this.onEvent = onEvent;
    this.onOpen = onOpen;
    this.onStatus = onStatus;
    this.lastId = null;
    this.stopped = true;
    this.controller = null;
  }

  start() {
    if (!this.stopped) return;
    this.stopped = false;
    this.lastId = null;
    this.loop();
  }

  stop() {
    this.stopped = true;
    this.controller?.abort();
  }

  async loop() {
    let delay = RETRY_MIN_MS;
    this.onStatus("connecting");
    while (!this.stopped) {
      this.controller = new AbortController();
      try {
        await this.follow(this.controller.signal, () => {
          delay = RETRY_MIN_MS;
        });
      } catch (error) {
        if (error instanceof Unauthorized) return;
        // a network error or a dropped connection: retry below
      }
      if (this.stopped) return;
      this.onStatus("reconnecting", this.lastId === null ? "" : `resuming after event ${this.lastId}`);
      await sleep(delay);
      delay = Math.min(delay * 2, RETRY_MAX_MS);
    }
  }

  async follow(signal, connected) {
    const headers = authHeaders({ Accept: "text/event-stream" });
    if (this.lastId !== null) headers["Last-Event-ID"] = this.lastId;
    const response = await fetch("/v1/events", { headers, signal, cache: "no-store", credentials: "omit" });
    if (response.status === 401) {
      const error = refused(await problemDetail(response));
      this.stop();
      throw error;
    }
    if (!response.ok || !response.body) throw new Error(`the event stream answered ${response.status}`);
    connected();
    const parser = new SseParser((message) => this.message(message));
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done || this.stopped) return;
        parser.push(value);
      }
    } finally {
      reader.releaseLock();
    }
  }

  message({ event, data, id }) {
    const fresh = this.lastId === null;
    if (id !== undefined && id !== "") this.lastId = id;
    if (event === "open") {
      this.onStatus("live");
      this.onOpen(Number(this.lastId), fresh);
    } else if (event === "error") {
      const why = parse(data) || {};
      // slow: the tab fell behind; gone: the log no longer holds our position. Either
      // way start again from the log's end, and reload the tables then (onOpen fresh).
      this.lastId = null;
      this.onStatus("reconnecting", `${why.reason || "error"}: ${why.detail || ""}`);
      this.controller?.abort();
    } else if (event === "message") {
      const cloud = parse(data);
      if (cloud && typeof cloud.type === "string") this.onEvent(cloud);
    }
  }
}

function parse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
