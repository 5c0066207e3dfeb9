// The job page's panels: summary, goodput, memory, checkpoints, events and dashboard links.
import { stackedBars } from "./chart.js";
import { age, append, clear, fmtBytes, fmtNum, fmtSeconds, h, statusBadge, table } from "./dom.js";
import { layoutOf } from "./layout.js";

export function renderSummary(el, job) {
  const m = job.metrics || {};
  const { strategy, text } = layoutOf(job);
  const objective = job.spec?.objective ?? "causal_lm";
  const item = (k, v) => h("div", { class: "kv" }, h("span", { class: "k" }, k), h("span", { class: "v" }, v));
  // The newest evaluation (the service keeps it past later steps), for jobs that evaluate.
  const evaluated = m.eval_loss !== undefined && m.eval_loss !== null;
  append(clear(el), [
    item("step", `${job.step ?? 0} / ${job.spec?.train?.steps ?? "?"}`),
    item("loss", fmtNum(m.loss, 4)),
    evaluated && item("eval loss", `${fmtNum(m.eval_loss, 4)} at step ${m.eval_step ?? "?"}`),
    evaluated && item("eval perplexity", fmtNum(m.eval_perplexity, 4)),
    // Objective dpo: how often, and by how much, the chosen answer wins.
    m.rewards_accuracy != null && item("reward accuracy", fmtNum(m.rewards_accuracy, 4)),
    m.rewards_margin != null &&
      item("reward margin", `${fmtNum(m.rewards_margin, 4)} (chosen ${fmtNum(m.rewards_chosen, 4)}, rejected ${fmtNum(m.rewards_rejected, 4)})`),
    item("tokens/s", fmtNum(m.tokens_per_s, 4)),
    item("world size", String(job.world_size ?? "–")),
    item("strategy", `${strategy} ${text}`),
    objective !== "causal_lm" && item("objective", objective),
    item("restarts", String(job.restarts ?? 0)),
    item("resubmits", String(job.resubmits ?? 0)),
    item("created", age(job.created_at) + " ago"),
  ]);
  if (job.error) el.append(h("div", { class: "error wide" }, job.error));
  for (const w of job.warnings || []) el.append(h("div", { class: "warning wide" }, w));
}

const GOODPUT_PARTS = [
  ["productive", (g) => g.productive_s],
  ["startup", (g) => g.breakdown.startup_s],
  ["waiting", (g) => g.breakdown.waiting_s],
  ["checkpoint blocking", (g) => g.breakdown.checkpoint_blocking_s],
  ["eval", (g) => g.breakdown.eval_s],
  ["restart/restore", (g) => g.breakdown.restart_restore_s],
  ["recomputed", (g) => g.breakdown.recomputed_s],
  ["other", (g) => g.breakdown.other_s],
];

export function renderGoodput(el, g) {
  clear(el);
  if (!g || !(g.wall_s > 0)) {
    el.append(h("p", { class: "muted" }, "no time measured yet"));
    return;
  }
  const parts = GOODPUT_PARTS.map(([name, get]) => ({ name, value: get(g) }));
  el.append(
    h("p", {}, `goodput ${(100 * g.goodput).toFixed(1)}% of ${fmtSeconds(g.wall_s)} wall time, `,
      `${g.steps} steps (${g.recomputed_steps} recomputed)`),
    stackedBars([{ label: "wall time", parts }], { format: fmtSeconds, id: "goodput-bar" }),
  );
  for (const note of g.notes || []) el.append(h("p", { class: "muted small" }, note));
}

// The objectives' frozen parts (a DPO reference model; a VAE and text encoder) after them.
const MEMORY_PARTS = ["params", "grads", "optimizer", "activations", "gathered_params", "buffers",
  "buckets", "reference", "vae", "text_encoder"];

function memoryParts(r) {
  return MEMORY_PARTS.map((name) => ({ name, value: r?.[name + "_bytes"] || 0 }));
}

export function renderMemory(el, mem) {
  clear(el);
  const ranks = mem?.ranks || [];
  if (!ranks.length) {
    el.append(h("p", { class: "muted" }, "measured at the first step"));
    return;
  }
  const rows = [];
  ranks.forEach((r, i) => {
    rows.push({ label: `rank ${i} measured`, parts: memoryParts(r), total: fmtBytes(r?.peak_bytes) });
    const planned = r && "planned" in r ? r.planned : i === 0 ? mem.planned : undefined;
    if (planned) {
      rows.push({ label: `rank ${i} planned`, parts: memoryParts(planned), total: fmtBytes(planned.total_bytes) });
    }
  });
  el.append(stackedBars(rows, { format: fmtBytes, id: "memory-bars" }));
  const anyPlan = mem.planned || ranks.some((r) => r && r.planned);
  if (!anyPlan) el.append(h("p", { class: "muted", id: "no-prediction" }, "no prediction"));
  if (mem.measured_at) el.append(h("p", { class: "muted small" }, `measured ${age(mem.measured_at)} ago`));
}

export function renderCheckpoints(el, items) {
  // The eval loss column (and the best mark) only for jobs that evaluate.
  const evaluated = items.some((c) => c.eval_loss !== null && c.eval_loss !== undefined);
  const rows = items
    .slice()
    .reverse()
    .map((c) => [
      c.best ? `${c.step} (best)` : String(c.step),
      ...(evaluated ? [c.eval_loss === null || c.eval_loss === undefined ? "–" : c.eval_loss.toFixed(4)] : []),
      fmtBytes(c.bytes),
      c.blocking_s === null || c.blocking_s === undefined ? "–" : fmtSeconds(c.blocking_s),
      fmtSeconds(c.total_s ?? c.save_s),
      h("span", { class: "mono" }, c.uri),
      age(c.created_at),
    ]);
  const head = ["step", ...(evaluated ? ["eval loss"] : []), "size", "blocking", "total", "where", "age"];
  clear(el).append(table(head, rows,
    { id: "checkpoints-table", empty: "no checkpoint yet" }));
}

export function renderEvents(el, events) {
  const rows = events
    .slice(-300)
    .reverse()
    .map((e) => [
      h("span", { title: e.ts }, new Date(e.ts).toLocaleTimeString()),
      h("span", { class: "kind kind-" + e.kind }, e.kind),
      e.message,
    ]);
  clear(el).append(table(["time", "kind", "message"], rows, { id: "events-table", empty: "no events yet" }));
}

// `url` if it is an http(s) address, else null (never a javascript: or data: link).
function webLink(url) {
  try {
    const parsed = new URL(url, location.href);
    return ["http:", "https:"].includes(parsed.protocol) ? parsed.href : null;
  } catch {
    return null;
  }
}

export function renderLinks(el, job) {
  clear(el);
  const links = Object.entries(job.dashboard_links || {});
  if (!links.length) {
    el.append(h("p", { class: "muted" }, "links appear once the job reaches Ray"));
  }
  const list = h("ul", { id: "dashboard-links" });
  for (const [name, url] of links) {
    const safe = webLink(url);
    list.append(h("li", {}, safe ? h("a", { href: safe, target: "_blank", rel: "noopener noreferrer" }, name.replace("_", " ")) : name));
  }
  el.append(list);
  if (job.dashboard_token_hint) el.append(h("p", { class: "muted", id: "token-hint" }, job.dashboard_token_hint));
}

export function header(job) {
  document.title = `${job.name} · etrain`;
  const title = document.getElementById("job-title");
  title.textContent = "";
  title.append(job.name, " ", h("span", { class: "mono muted" }, job.id));
  const st = document.getElementById("job-status");
  clear(st).append(statusBadge(job.status));
}
