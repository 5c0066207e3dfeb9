// The plan page: a pasted or uploaded spec (and, optionally, the cluster to plan it for),
// POST /v1/plan, its verdict, memory, layouts and, on mixed GPUs, where each rank goes;
// Submit posts the same spec to /v1/jobs and opens the new job.
import { api, requireToken } from "./api.js";
import { stackedBars } from "./chart.js";
import { $, clear, fmtBytes, h, showError, table, wireHeader } from "./dom.js";

// The spec text and its media type: JSON if it parses as JSON, else YAML.
function specBody() {
  const text = $("spec").value;
  if (!text.trim()) throw new Error("spec: paste a job spec or choose a file");
  try {
    JSON.parse(text);
    return { text, type: "application/json" };
  } catch {
    return { text, type: "application/yaml" };
  }
}

// A YAML (or JSON) document indented under a key of a YAML mapping (JSON is YAML too).
function under(key, text) {
  const indented = text.replace(/^---\s*$/m, "").split("\n").map((l) => "  " + l).join("\n");
  return key + ":\n" + indented + "\n";
}

// {"spec": <the document>, "cluster": <the optional description>}, without parsing YAML
// here: JSON when both are JSON (or there is no cluster), else YAML.
function planBody({ text, type }) {
  const cluster = $("cluster").value.trim();
  if (!cluster) return { text: type === "application/json" ? `{"spec": ${text}}` : under("spec", text), type };
  try {
    JSON.parse(cluster);
    if (type === "application/json") return { text: `{"spec": ${text}, "cluster": ${cluster}}`, type };
  } catch {
    // YAML: both go as YAML below
  }
  return { text: under("spec", text) + under("cluster", cluster), type: "application/yaml" };
}

const PARTS = ["params", "grads", "optimizer", "activations", "buffers"];

function renderPlan(plan) {
  $("result").hidden = false;
  const verdict = $("verdict");
  verdict.textContent = plan.verdict;
  verdict.className = "verdict verdict-" + plan.verdict.replace(/ /g, "-");
  const findings = clear($("findings"));
  if (plan.unknown_reason) findings.append(h("div", { class: "warning" }, plan.unknown_reason));
  for (const e of plan.errors) findings.append(h("div", { class: "error plan-error" }, e));
  for (const w of plan.warnings) findings.append(h("div", { class: "warning plan-warning" }, w));
  for (const n of plan.notes) findings.append(h("div", { class: "note" }, n));
  const pr = plan.per_rank;
  const parts = PARTS.map((name) => ({ name, value: pr[name + "_bytes"] }));
  const gpu = worstRanksGpu(plan) ?? plan.breakdown.gpu_memory_bytes;
  const rows = [{ label: `pp rank ${plan.breakdown.worst_pp_rank}`, parts, total: fmtBytes(pr.total_bytes) }];
  clear($("plan-memory")).append(
    stackedBars(rows, { format: fmtBytes, scale: gpu && gpu > pr.total_bytes ? gpu : undefined, id: "plan-bars" }),
    h("p", { class: "muted" }, gpu ? `of ${fmtBytes(gpu)} GPU memory` : "GPU memory unknown",
      ` · host ${fmtBytes(plan.breakdown.host_bytes)} per rank · ${plan.num_params.toLocaleString()} parameters`),
  );
  const l = plan.layout;
  const workers = typeof l.workers === "object" ? `${l.workers.min}–${l.workers.max}` : l.workers;
  clear($("plan-layout")).append(
    h("p", {}, `${plan.breakdown.layout} on ${workers} workers (grad accumulation ${l.grad_accum_steps})`),
    plan.recommended_layout
      ? h("p", { id: "recommendation" }, `Recommended: ${plan.recommended_layout.layout} — ${plan.recommended_layout.reason}`)
      : h("p", { class: "muted" }, "no recommendation"),
  );
  renderPlacement(plan.placement);
  const cands = plan.candidates.map((c) => [
    c.layout, String(c.dp), String(c.tp), String(c.pp), `${c.total_gib} GiB`,
    c.fits === null ? "unknown" : c.fits ? "yes" : "no",
    c.step_s === undefined || c.step_s === null ? "–" : `${c.step_s.toFixed(3)} s`,
  ]);
  clear($("candidates")).append(
    table(["layout", "dp", "tp", "pp", "memory", "fits", "step"], cands, { id: "candidates-table", empty: "none" }),
  );
}

// On GPU nodes of different sizes, the memory of the GPU the worst rank is placed on.
function worstRanksGpu(plan) {
  const p = plan.placement;
  if (!p || !p.fits) return null;
  const worst = p.rank_bytes.indexOf(Math.max(...p.rank_bytes));
  const node = p.nodes.find((n) => n.ranks.includes(worst));
  return node ? node.gpu_memory_bytes : null;
}

// Where each rank goes on GPU nodes of different sizes, and which ranks bound the layout.
function renderPlacement(placement) {
  $("plan-placement").hidden = !placement;
  if (!placement) return;
  const rows = placement.nodes.map((n) => [
    n.node, String(n.gpus), fmtBytes(n.gpu_memory_bytes),
    n.ranks.length ? n.ranks.join(", ") : n.holds_a_rank ? "–" : "none fits",
    n.ranks.map((r) => fmtBytes(placement.rank_bytes[r])).join(", "),
  ]);
  clear($("placement")).append(
    table(["node", "GPUs", "memory each", "ranks", "each rank needs"], rows, { id: "placement-table" }),
    h("p", { id: "placement-summary", class: placement.fits ? "muted" : "error" }, placement.summary),
  );
}

async function doPlan(event) {
  event.preventDefault();
  const button = $("plan-button");
  button.disabled = true;
  try {
    const body = planBody(specBody());
    const plan = await api("/v1/plan", { method: "POST", body: body.text, type: body.type });
    showError($("error"), null);
    renderPlan(plan);
  } catch (err) {
    $("result").hidden = true;
    showError($("error"), err);
  } finally {
    button.disabled = false;
  }
}

async function doSubmit() {
  const button = $("submit-button");
  button.disabled = true;
  try {
    const body = specBody();
    const job = await api("/v1/jobs", { method: "POST", body: body.text, type: body.type });
    location.assign("/ui/jobs/" + encodeURIComponent(job.id));
  } catch (err) {
    showError($("error"), err);
  } finally {
    button.disabled = false;
  }
}

function readFile() {
  const file = $("spec-file").files[0];
  if (!file) return;
  file.text().then((text) => {
    $("spec").value = text;
  });
}

if (requireToken()) {
  wireHeader();
  $("plan-form").addEventListener("submit", doPlan);
  $("submit-button").addEventListener("click", doSubmit);
  $("spec-file").addEventListener("change", readFile);
}
