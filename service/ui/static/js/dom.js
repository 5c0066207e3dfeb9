// DOM helpers: every text goes in through textContent (API strings are tenant input).
import { signOut } from "./api.js";

// h("td", {class: "num", title: "x"}, "text", childNode, ...)
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function $(id) {
  return document.getElementById(id);
}

export function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Number(n);
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return (i === 0 ? String(v) : v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)) + " " + units[i];
}

export function fmtNum(v, digits = 3) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return Number(v).toExponential(2);
  return String(Number(Number(v).toPrecision(digits)));
}

export function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 60) return `${Number(s).toFixed(s < 10 ? 2 : 1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} m ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} m`;
}

export function age(iso) {
  if (!iso) return "–";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

export function statusBadge(status) {
  return h("span", { class: "status status-" + String(status).toLowerCase() }, status);
}

// A table inside a horizontal scroll container: head = ["col", ...], rows = [[cell, ...]].
export function table(head, rows, { id, empty = "nothing yet" } = {}) {
  const thead = h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c))));
  const body = rows.length
    ? rows.map((r) => h("tr", {}, r.map((c) => (c instanceof Node && c.tagName === "TD" ? c : h("td", {}, c)))))
    : [h("tr", {}, h("td", { colspan: head.length, class: "empty" }, empty))];
  return h("div", { class: "table-scroll" }, h("table", { id }, thead, h("tbody", {}, body)));
}

export function showError(el, err) {
  clear(el);
  if (!err) {
    el.hidden = true;
    return;
  }
  el.hidden = false;
  for (const line of String(err.message || err).split("\n")) el.append(h("div", {}, line));
}

// The sign-out link of the page header.
export function wireHeader() {
  const link = document.getElementById("signout");
  if (link) {
    link.addEventListener("click", (e) => {
      e.preventDefault();
      signOut();
    });
  }
  for (const a of document.querySelectorAll("nav a[data-page]")) {
    if (document.body.dataset.page === a.dataset.page) a.classList.add("active");
  }
}
