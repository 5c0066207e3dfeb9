// The log tail: GET /logs?follow=true read as a stream while the job runs; the last 500 lines.
import { api } from "./api.js";

const KEEP = 500;
// Terminal colour codes Ray puts around its prefixes ("\x1b[36m(RayTrainWorker pid=1)\x1b[0m").
const ANSI = /\x1b\[[0-9;]*[A-Za-z]/g;

export class LogTail {
  constructor(pre, stateEl, jobId) {
    this.pre = pre;
    this.stateEl = stateEl;
    this.path = `/v1/jobs/${encodeURIComponent(jobId)}/logs`;
    this.lines = [];
    this.partial = "";
    this.running = false;
  }

  set(text) {
    this.lines = [];
    this.partial = "";
    this.add(text);
  }

  add(text) {
    const parts = (this.partial + text.replace(ANSI, "")).split("\n");
    this.partial = parts.pop();
    this.lines.push(...parts);
    if (this.lines.length > KEEP) this.lines.splice(0, this.lines.length - KEEP);
    const atBottom = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 4;
    this.pre.textContent = this.lines.join("\n") + (this.partial ? "\n" + this.partial : "");
    if (atBottom) this.pre.scrollTop = this.pre.scrollHeight;
  }

  // Follow the stream until it ends (the job's Ray submission ended) or fails.
  async follow() {
    if (this.running) return;
    this.running = true;
    this.stateEl.textContent = "(following)";
    try {
      const response = await api(this.path + "?follow=true", { raw: true });
      if (!response.ok || !response.body) return;
      this.set("");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        this.add(value);
      }
    } catch (err) {
      console.warn("log stream:", err.message);
    } finally {
      this.running = false;
      this.stateEl.textContent = "";
    }
  }

  async once() {
    const response = await api(this.path, { raw: true });
    if (response.ok) this.set(await response.text());
  }
}
