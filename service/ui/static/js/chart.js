// etrain's charts, drawn as inline SVG: a line chart against step (axes, ticks, the value
// under the pointer, vertical markers on the step axis, more series with a legend) and
// stacked horizontal bars.
import { h } from "./dom.js";

const NS = "http://www.w3.org/2000/svg";
const W = 640;
const H = 220;
const PAD = { left: 66, right: 12, top: 12, bottom: 28 };

function s(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// About `count` round tick values covering [lo, hi].
export function ticks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((m) => m >= raw) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(Number(v.toPrecision(12)));
  }
  return out;
}

function label(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
  return String(Number(v.toPrecision(4)));
}

// A label function for these ticks: as many decimals as their spacing needs.
function tickLabel(values) {
  const step = values.length > 1 ? Math.abs(values[1] - values[0]) : Math.abs(values[0]) || 1;
  const big = Math.max(...values.map(Math.abs));
  if (big >= 1e5 || (big > 0 && big < 1e-3)) {
    const digits = Math.min(6, Math.max(1, Math.ceil(Math.log10(big / step))));
    return (v) => (v === 0 ? "0" : v.toExponential(digits));
  }
  const decimals = Math.max(0, -Math.floor(Math.log10(step)));
  return (v) => v.toFixed(decimals);
}

// Index of the point whose x is nearest to `x` (points sorted by x).
function nearest(points, x) {
  let lo = 0;
  let hi = points.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (points[mid].x < x) lo = mid;
    else hi = mid;
  }
  return Math.abs(points[lo].x - x) <= Math.abs(points[hi].x - x) ? lo : hi;
}

// Add `p` ({x, y}) to `points`, ascending x; null or non-finite y is skipped. A point at or
// before the last one means a restart re-ran steps: it replaces those from there on.
function addPoint(points, p) {
  if (p.y === null || p.y === undefined || !Number.isFinite(p.y)) return points;
  const last = points[points.length - 1];
  const kept = last && p.x <= last.x ? points.filter((q) => q.x < p.x) : points;
  kept.push(p);
  return kept;
}

export class LineChart {
  // `series` names the lines (the first is the main one). The others get a dot at each
  // point (they may be sparse), and a legend shows once one of them has a point.
  constructor(container, { title, id, format = label, series = [title] }) {
    this.format = format;
    this.markers = [];
    this.svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", id });
    this.svg.append(s("title", {}, title));
    this.grid = s("g", { class: "grid" });
    this.markerLayer = s("g", { class: "markers" });
    this.series = series.map((name, i) => ({
      name,
      points: [],
      line: s("polyline", { class: `series series-${i}`, points: "", "data-series": name }),
      dots: s("g", { class: `dots series-${i}`, "data-series": name }),
    }));
    this.hover = s("g", { class: "hover", visibility: "hidden" });
    this.hoverLine = s("line", { y1: PAD.top, y2: H - PAD.bottom });
    this.hoverDot = s("circle", { r: 3 });
    this.hoverText = s("text", { y: PAD.top + 10 });
    this.hover.append(this.hoverLine, this.hoverDot, this.hoverText);
    this.svg.append(this.grid, this.markerLayer, ...this.series.flatMap((se) => [se.line, se.dots]), this.hover);
    this.empty = s("text", { x: W / 2, y: H / 2, class: "chart-empty" }, "no data yet");
    this.svg.append(this.empty);
    this.svg.addEventListener("mousemove", (e) => this.onMove(e));
    this.svg.addEventListener("mouseleave", () => this.hover.setAttribute("visibility", "hidden"));
    this.legend = h("div", { class: "legend chart-legend", hidden: true },
      this.series.map((se, i) => h("span", {}, h("i", { class: `swatch line-${i}` }), se.name)));
    container.append(h("figure", { class: "chart-box" }, h("figcaption", {}, title), this.svg, this.legend));
  }

  // The main series' points.
  get points() {
    return this.series[0].points;
  }

  // Add points ({x, y}, ascending x after the ones already drawn) to the main series, and
  // `more[name]` to the series of that name; set the markers. A restart that re-ran steps
  // (a main point at or before the last) drops every series' points from there on.
  update(newPoints, markers, more = {}) {
    const [main, ...others] = this.series;
    for (const p of newPoints) {
      const last = main.points[main.points.length - 1];
      if (last && p.x <= last.x && Number.isFinite(p.y)) {
        for (const se of others) se.points = se.points.filter((q) => q.x < p.x);
      }
      main.points = addPoint(main.points, p);
    }
    for (const se of others) {
      for (const p of more[se.name] || []) se.points = addPoint(se.points, p);
    }
    if (markers) this.markers = markers;
    this.draw();
  }

  scales() {
    const all = this.series.flatMap((se) => se.points);
    const xs = all.map((p) => p.x).concat(this.markers.map((m) => m.x));
    const ys = all.map((p) => p.y);
    let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
    let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
    if (x1 === x0) [x0, x1] = [x0 - 1, x1 + 1];
    if (y1 === y0) [y0, y1] = [y0 - Math.abs(y0 || 1) * 0.1, y1 + Math.abs(y1 || 1) * 0.1];
    const pad = (y1 - y0) * 0.05;
    [y0, y1] = [y0 - pad, y1 + pad];
    const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
    const sy = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
    return { x0, x1, y0, y1, sx, sy };
  }

  draw() {
    this.grid.replaceChildren();
    this.markerLayer.replaceChildren();
    for (const se of this.series) se.dots.replaceChildren();
    const any = this.series.some((se) => se.points.length);
    this.legend.hidden = !this.series.slice(1).some((se) => se.points.length);
    this.empty.setAttribute("visibility", any ? "hidden" : "visible");
    if (!any) {
      for (const se of this.series) se.line.setAttribute("points", "");
      return;
    }
    const sc = (this.sc = this.scales());
    this.drawAxes(sc);
    for (const m of this.markers) {
      const x = sc.sx(m.x).toFixed(1);
      const g = s("g", { class: "marker marker-" + m.kind, "data-kind": m.kind, "data-step": m.x });
      g.append(s("title", {}, m.label));
      g.append(s("line", { x1: x, x2: x, y1: PAD.top, y2: H - PAD.bottom }));
      this.markerLayer.append(g);
    }
    this.series.forEach((se, i) => {
      const xy = se.points.map((p) => [sc.sx(p.x).toFixed(1), sc.sy(p.y).toFixed(1)]);
      se.line.setAttribute("points", xy.map(([x, y]) => `${x},${y}`).join(" "));
      if (i > 0) for (const [cx, cy] of xy) se.dots.append(s("circle", { cx, cy, r: 2.5 }));
    });
  }

  drawAxes(sc) {
    const bottom = H - PAD.bottom;
    this.grid.append(s("line", { x1: PAD.left, x2: W - PAD.right, y1: bottom, y2: bottom, class: "axis" }));
    this.grid.append(s("line", { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: bottom, class: "axis" }));
    const yTicks = ticks(sc.y0, sc.y1, 4);
    const yLabel = tickLabel(yTicks);
    for (const v of yTicks) {
      const y = sc.sy(v).toFixed(1);
      this.grid.append(s("line", { x1: PAD.left, x2: W - PAD.right, y1: y, y2: y, class: "tick" }));
      this.grid.append(s("text", { x: PAD.left - 6, y, class: "ylabel" }, yLabel(v)));
    }
    for (const v of ticks(sc.x0, sc.x1, 6).filter(Number.isInteger)) {
      const x = sc.sx(v).toFixed(1);
      this.grid.append(s("line", { x1: x, x2: x, y1: bottom, y2: bottom + 4, class: "axis" }));
      this.grid.append(s("text", { x, y: bottom + 16, class: "xlabel" }, String(v)));
    }
    this.grid.append(s("text", { x: W - PAD.right, y: H - 2, class: "xname" }, "step"));
  }

  // The point nearest to step `x` over all series, and each series' value at its step.
  pointAt(x) {
    const drawn = this.series.filter((se) => se.points.length);
    const near = drawn.map((se) => se.points[nearest(se.points, x)]);
    const p = near.reduce((a, b) => (Math.abs(b.x - x) < Math.abs(a.x - x) ? b : a));
    const values = drawn
      .map((se) => [se.name, se.points[nearest(se.points, p.x)]])
      .filter(([, q]) => q.x === p.x);
    return { p, values };
  }

  onMove(event) {
    if (!this.series.some((se) => se.points.length) || !this.sc) return;
    const box = this.svg.getBoundingClientRect();
    const px = ((event.clientX - box.left) / box.width) * W;
    const sc = this.sc;
    const x = sc.x0 + ((px - PAD.left) / (W - PAD.left - PAD.right)) * (sc.x1 - sc.x0);
    const { p, values } = this.pointAt(x);
    const cx = sc.sx(p.x);
    const cy = sc.sy(p.y);
    this.hoverLine.setAttribute("x1", cx);
    this.hoverLine.setAttribute("x2", cx);
    this.hoverDot.setAttribute("cx", cx);
    this.hoverDot.setAttribute("cy", cy);
    const right = cx > W / 2;
    this.hoverText.setAttribute("x", right ? cx - 6 : cx + 6);
    this.hoverText.setAttribute("text-anchor", right ? "end" : "start");
    this.hoverText.textContent =
      this.series.length > 1
        ? `step ${p.x}: ` + values.map(([name, q]) => `${name} ${this.format(q.y)}`).join(", ")
        : `step ${p.x}: ${this.format(p.y)}`;
    this.hover.setAttribute("visibility", "visible");
  }
}

// Stacked horizontal bars: rows = [{label, parts: [{name, value}]}], one color per part name.
// `scale` is the value of a full-width bar (default: the largest row's sum).
export function stackedBars(rows, { format = String, scale, id } = {}) {
  // The parts that some row has (a part every row lacks gets no colour and no legend).
  const names = [...new Set(rows.flatMap((r) => r.parts.filter((p) => p.value > 0).map((p) => p.name)))];
  const max = scale || Math.max(1e-12, ...rows.map((r) => r.parts.reduce((a, p) => a + (p.value || 0), 0)));
  const colour = (name) => "c" + (names.indexOf(name) % 8);
  const bars = rows.map((r) => {
    const total = r.parts.reduce((a, p) => a + (p.value || 0), 0);
    const bar = h("div", { class: "bar" });
    for (const p of r.parts) {
      if (!(p.value > 0)) continue;
      const seg = h("span", { class: "seg " + colour(p.name), title: `${p.name}: ${format(p.value)}` });
      seg.style.width = ((100 * p.value) / max).toFixed(3) + "%";
      bar.append(seg);
    }
    return h("div", { class: "bar-row" }, h("span", { class: "bar-label" }, r.label), bar,
      h("span", { class: "bar-total" }, r.total === undefined ? format(total) : r.total));
  });
  const legend = h("div", { class: "legend" },
    names.map((n) => h("span", {}, h("i", { class: "swatch " + colour(n) }), n)));
  return h("div", { class: "bars", id }, bars, legend);
}
