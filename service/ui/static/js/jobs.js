// The jobs page: the caller's jobs, refreshed every 2 s while the tab is visible.
import { api, poll, requireToken } from "./api.js";
import { $, age, clear, fmtNum, h, showError, statusBadge, table, wireHeader } from "./dom.js";
import { layoutOf, workersOf } from "./layout.js";

const HEAD = ["id", "name", "status", "strategy", "layout", "world size", "step", "loss",
  "tokens/s", "restarts", "age"];

function row(job) {
  const m = job.metrics || {};
  const { strategy, text } = layoutOf(job);
  const w = workersOf(job.spec);
  const size = job.world_size ?? (w.min === w.max ? w.min : `${w.min}–${w.max}`);
  const steps = job.spec?.train?.steps;
  return [
    h("a", { href: "/ui/jobs/" + encodeURIComponent(job.id), class: "mono" }, job.id),
    job.name,
    statusBadge(job.status),
    strategy,
    text,
    String(size),
    `${job.step ?? 0} / ${steps ?? "?"}`,
    fmtNum(m.loss, 4),
    fmtNum(m.tokens_per_s, 4),
    String((job.restarts || 0) + (job.resubmits || 0)),
    h("span", { title: job.created_at }, age(job.created_at)),
  ];
}

async function refresh() {
  const status = $("status-filter").value;
  const query = new URLSearchParams({ limit: "200" });
  if (status) query.set("status", status);
  try {
    const page = await api("/v1/jobs?" + query);
    showError($("error"), null);
    $("jobs-total").textContent = `${page.total} job${page.total === 1 ? "" : "s"}`;
    const rows = page.items.map(row);
    clear($("jobs")).append(table(HEAD, rows, { id: "jobs-table", empty: "no jobs" }));
  } catch (err) {
    if (err.status !== 401) showError($("error"), err);
  }
}

function main() {
  if (!requireToken()) return;
  wireHeader();
  const filter = $("status-filter");
  filter.value = new URLSearchParams(location.search).get("status") || "";
  filter.addEventListener("change", () => {
    const url = new URL(location.href);
    if (filter.value) url.searchParams.set("status", filter.value);
    else url.searchParams.delete("status");
    history.replaceState(null, "", url);
    refresh();
  });
  poll(refresh, 2000);
}

main();
