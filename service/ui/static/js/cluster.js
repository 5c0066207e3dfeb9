// The cluster page: nodes and their resources, what is free, and the queue with reasons.
import { api, poll, requireToken } from "./api.js";
import { $, clear, fmtBytes, fmtNum, h, showError, table, wireHeader } from "./dom.js";

// A node's GPUs: count, then each device's model and memory (Ray's reporter agent), else the
// accelerator_type:* resource names.
function gpus(n) {
  const count = n.resources.GPU || 0;
  let kinds = (n.gpus || []).map((g) => (g.name || "GPU") + (g.memory_mb ? ` ${fmtBytes(g.memory_mb * 2 ** 20)}` : ""));
  if (!kinds.length) {
    kinds = Object.keys(n.resources)
      .filter((k) => k.startsWith("accelerator_type:"))
      .map((k) => k.slice("accelerator_type:".length));
  }
  let text = count ? String(fmtNum(count)) : "0";
  if (kinds.length) text += " × " + [...new Set(kinds)].join(", ");
  return text;
}

// The memory of one of a node's GPUs as plans count it (the service's gpu_memory_gb), marked
// when the operator's label gave it; "–" without GPUs or a known size.
function gpuMemory(n) {
  if (n.gpu_memory_gb == null) return "–";
  const text = fmtBytes(n.gpu_memory_gb * 2 ** 30);
  if (n.gpu_memory_source !== "label") return text;
  return h("span", { title: "label etrain.io/gpu-memory-gb" }, text + " (label)");
}

// On GPUs of different sizes, which nodes plans place ranks on and what each GPU holds.
function mixedLine(gpuNodes) {
  const each = gpuNodes.map((g) => `${g.name}: ${g.gpus} × ${fmtNum(g.gpu_memory_gb)} GiB`);
  const smallest = Math.min(...gpuNodes.map((g) => g.gpu_memory_gb));
  return `GPUs of different sizes (${each.join("; ")}): a job is placed only where each rank fits; the smallest (${fmtNum(smallest)} GiB) bounds a layout that spans every node.`;
}

// "free / total" of one resource on a node.
function freeOf(n, key, fmt) {
  const total = n.resources[key];
  if (!total) return "–";
  const free = (n.available || {})[key];
  return free === undefined ? fmt(total) : `${fmt(free)} / ${fmt(total)}`;
}

function nodeRows(nodes) {
  return nodes.map((n) => [
    h("span", { class: "mono", title: n.node_id || "" }, (n.node_id || "–").slice(0, 12)),
    n.ip || "–",
    n.is_head ? "head" : "worker",
    freeOf(n, "CPU", fmtNum),
    gpus(n),
    gpuMemory(n),
    freeOf(n, "GPU", fmtNum),
    freeOf(n, "memory", fmtBytes),
  ]);
}

function totals(c) {
  const keys = ["CPU", "GPU", "memory", "object_store_memory"];
  const fmt = (k, v) => (k.includes("memory") ? fmtBytes(v) : fmtNum(v ?? 0));
  const rows = keys
    .filter((k) => k in c.total)
    .map((k) => [k, fmt(k, c.total[k]), fmt(k, c.available[k] ?? 0)]);
  return table(["resource", "total", "free"], rows, { id: "totals-table" });
}

function renderQueue(el, queue) {
  clear(el);
  if (!Array.isArray(queue)) {
    el.append(h("p", { class: "muted" }, "the service does not report its queue"));
    return;
  }
  const rows = queue.map((q) => [
    String(q.position ?? ""),
    q.job_id ? h("a", { href: "/ui/jobs/" + encodeURIComponent(q.job_id), class: "mono" }, q.job_id) : "–",
    q.name || "–",
    q.tenant || "–",
    q.reason || "",
  ]);
  el.append(table(["#", "job", "name", "tenant", "why it waits"], rows, { id: "queue-table", empty: "no job is waiting" }));
}

// The job drivers kept warm ahead of the next jobs, what they hold, and the warm pool's budget.
function standbyLine(s) {
  const gb = (b) => (b / 1e9).toFixed(1);
  const b = s.budget;
  const budget = b ? `; budget ${b.processes} processes, ${gb(b.memory_bytes)} GB, stops after ${b.idle_s} s idle` : "";
  const state = s.shrunk ? "stopped after idle time (the next job brings them back)" : `${s.warm} warm, ${s.idle - s.warm} warming, ${s.busy} running a job`;
  return `Standby job drivers: ${state} (${s.configured} kept): ${s.processes} processes, ${gb(s.memory_bytes)} GB of host memory${budget}`;
}

async function refresh() {
  try {
    const c = await api("/v1/cluster");
    showError($("error"), null);
    clear($("totals")).append(totals(c));
    if (c.dashboard_url) $("totals").append(h("p", { class: "muted" }, "Ray dashboard: " + c.dashboard_url));
    if (c.gpu_nodes) $("totals").append(h("p", { class: "muted", id: "mixed-gpus" }, mixedLine(c.gpu_nodes)));
    if (c.standby) $("totals").append(h("p", { class: "muted", id: "standby" }, standbyLine(c.standby)));
    clear($("nodes")).append(table(["node", "ip", "role", "CPUs free / total", "GPUs", "GPU memory", "GPUs free / total", "memory free / total"], nodeRows(c.nodes), { id: "nodes-table", empty: "no nodes" }));
    renderQueue($("queue"), c.queue);
  } catch (err) {
    if (err.status !== 401) showError($("error"), err);
  }
}

if (requireToken()) {
  wireHeader();
  poll(refresh, 3000);
}
