// A job's page: live charts against step, markers, panels, the log tail and Cancel.
import { api, poll, requireToken } from "./api.js";
import { LineChart } from "./chart.js";
import { $, showError, wireHeader } from "./dom.js";
import {
  header,
  renderCheckpoints,
  renderEvents,
  renderGoodput,
  renderLinks,
  renderMemory,
  renderSummary,
} from "./job_panels.js";
import { LogTail } from "./logs.js";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const MARKED = { worker_failed: "restart", resubmitted: "restart", resized: "resize" };
const jobId = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const base = `/v1/jobs/${encodeURIComponent(jobId)}`;
const state = { afterStep: -1, afterId: 0, steps: [], events: [], checkpoints: [], job: null };

// The newest step reported at or before `iso` (an event's time on the step axis).
function stepAt(iso) {
  const t = Date.parse(iso);
  let step = 0;
  for (const m of state.steps) {
    if (Date.parse(m.ts) <= t) step = m.step;
    else break;
  }
  return step;
}

function markers() {
  const out = [];
  for (const e of state.events) {
    const kind = MARKED[e.kind];
    if (kind) out.push({ x: stepAt(e.ts), kind, label: `${e.kind}: ${e.message}` });
  }
  for (const c of state.checkpoints) out.push({ x: c.step, kind: "checkpoint", label: `checkpoint at step ${c.step}` });
  return out;
}

function makeCharts() {
  const box = $("charts");
  return {
    // Training loss at every step; the held-out loss at the steps that evaluate.
    loss: new LineChart(box, { title: "loss", id: "chart-loss", series: ["train", "eval"] }),
    lr: new LineChart(box, { title: "learning rate", id: "chart-lr" }),
    tokens: new LineChart(box, { title: "tokens/s", id: "chart-tokens" }),
  };
}

async function fetchSeries() {
  const [metrics, events, checkpoints] = await Promise.all([
    api(`${base}/metrics?after_step=${state.afterStep}`),
    api(`${base}/events?after_id=${state.afterId}`),
    api(`${base}/checkpoints`),
  ]);
  const fresh = metrics.items.filter((m) => m.step > state.afterStep);
  if (fresh.length) {
    state.steps.push(...fresh);
    state.afterStep = fresh[fresh.length - 1].step;
  }
  if (events.items.length) {
    state.events.push(...events.items);
    state.afterId = events.items[events.items.length - 1].id;
  }
  state.checkpoints = checkpoints.items;
  return { fresh, newEvents: events.items.length > 0 };
}

function drawSeries(charts, fresh) {
  const marks = markers();
  const evals = fresh.filter((m) => m.eval_loss !== undefined && m.eval_loss !== null);
  charts.loss.update(fresh.map((m) => ({ x: m.step, y: m.loss })), marks, {
    eval: evals.map((m) => ({ x: m.step, y: m.eval_loss })),
  });
  charts.lr.update(fresh.map((m) => ({ x: m.step, y: m.lr })), marks);
  charts.tokens.update(fresh.map((m) => ({ x: m.step, y: m.tokens_per_s })), marks);
}

async function refresh(charts, logs) {
  const job = await api(base);
  const first = state.job === null;
  state.job = job;
  header(job);
  renderSummary($("summary"), job);
  renderLinks($("links"), job);
  $("cancel").hidden = TERMINAL.has(job.status);
  const { fresh, newEvents } = await fetchSeries();
  drawSeries(charts, fresh);
  if (newEvents || first) renderEvents($("events"), state.events);
  renderCheckpoints($("checkpoints"), state.checkpoints);
  const [goodput, memory] = await Promise.all([
    api(`${base}/goodput`).catch(() => null),
    api(`${base}/memory`).catch(() => null),
  ]);
  renderGoodput($("goodput"), goodput);
  renderMemory($("memory"), memory);
  if (TERMINAL.has(job.status)) {
    if (!logs.running) await logs.once();
    return true;
  }
  if (job.submission_id && !logs.running) logs.follow();
  return false;
}

async function cancel() {
  if (!confirm(`Cancel job ${state.job ? state.job.name : jobId}?`)) return;
  const button = $("cancel");
  button.disabled = true;
  try {
    const job = await api(`${base}/cancel`, { method: "POST" });
    header(job);
    button.hidden = TERMINAL.has(job.status);
    showError($("error"), null);
  } catch (err) {
    showError($("error"), err);
  } finally {
    button.disabled = false;
  }
}

function main() {
  if (!requireToken()) return;
  wireHeader();
  const charts = makeCharts();
  const logs = new LogTail($("logs"), $("log-state"), jobId);
  $("cancel").addEventListener("click", cancel);
  let stop = null;
  let ended = false;
  stop = poll(async () => {
    if (ended) return;
    try {
      ended = await refresh(charts, logs);
      showError($("error"), null);
    } catch (err) {
      if (err.status !== 401) showError($("error"), err);
      if (err.status === 404) ended = true;
    }
    if (ended && stop) stop();
  }, 2000);
}

main();
