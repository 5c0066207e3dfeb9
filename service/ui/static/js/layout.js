// How a job's spec splits its model: "fsdp dp=2", "hybrid dp=1 tp=2 pp=2", ...
export function workersOf(spec) {
  const w = spec?.resources?.workers;
  if (w && typeof w === "object") return { min: w.min, max: w.max };
  return { min: w ?? 1, max: w ?? 1 };
}

export function layoutOf(spec, worldSize) {
  const par = spec?.parallelism || {};
  const strategy = par.strategy || "ddp";
  const tp = par.tp || 1;
  const pp = par.pp || 1;
  const world = worldSize || workersOf(spec).min;
  const dp = par.dp || Math.max(1, Math.floor(world / (tp * pp)));
  const parts = [`dp=${dp}`];
  if (tp > 1) parts.push(`tp=${tp}`);
  if (pp > 1) parts.push(`pp=${pp}`);
  if (strategy === "fsdp" || strategy === "hybrid") {
    const zero = par.fsdp?.zero_stage;
    if (zero && strategy === "fsdp") parts.push(`zero${zero}`);
    if (par.fsdp?.cpu_offload) parts.push("offload");
  }
  if (pp > 1 && par.pipeline?.schedule) parts.push(par.pipeline.schedule);
  return { strategy, text: parts.join(" ") };
}
