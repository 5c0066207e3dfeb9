// How a job splits its model: "fsdp dp=2", "hybrid dp=1 tp=2 pp=2", ...
export function workersOf(spec) {
  const w = spec?.resources?.workers;
  if (w && typeof w === "object") return { min: w.min, max: w.max };
  return { min: w ?? 1, max: w ?? 1 };
}

// The data-parallel degree is the API's (job.data_parallel), never computed here: at the
// size the job runs at, or before it reports one, the elastic range ("dp=1–2").
export function dpOf(job) {
  const d = job?.data_parallel || {};
  if (d.current != null) return String(d.current);
  return d.min === d.max ? String(d.min) : `${d.min}–${d.max}`;
}

export function layoutOf(job) {
  const par = job?.spec?.parallelism || {};
  const strategy = par.strategy || "ddp";
  const tp = par.tp || 1;
  const pp = par.pp || 1;
  const parts = [`dp=${dpOf(job)}`];
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
