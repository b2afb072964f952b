// Building the page: every text from the API or the event stream goes in as a text
// node (textContent), never as HTML: job names, users and reasons are hostile input.

/** An element: h("td", {class: "num", dataset: {job: id}}, "text", child, ...). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "class") el.className = value;
    else if (key === "text") el.textContent = String(value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A link to a hash route; `href` is built from ids checked by the API's patterns. */
export function link(route, text, attrs = {}) {
  return h("a", { href: `#/${route}`, ...attrs }, text);
}

export function jobLink(id, attrs = {}) {
  return link(`jobs/${encodeURIComponent(id)}`, shortId(id), { title: id, ...attrs });
}

/** The last 8 characters of a ULID tell jobs apart on screen; the title has all. */
export function shortId(id) {
  return id.length > 12 ? `…${id.slice(-8)}` : id;
}

export function badge(state) {
  return h("span", { class: `badge state-${state}`, dataset: { state } }, state.replace("_", " "));
}

export function table(headers, rows, attrs = {}) {
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, headers.map((text) => h("th", {}, text)))),
    h("tbody", {}, rows),
  );
}

export function empty(text) {
  return h("p", { class: "empty muted" }, text);
}

/** A section with a heading, and an optional note beside it. */
export function section(title, note, ...children) {
  return h(
    "section",
    { class: "card" },
    h("div", { class: "card-head" }, h("h2", {}, title), note ? h("span", { class: "muted" }, note) : null),
    children,
  );
}

// --- formatting ---------------------------------------------------------------------

export function when(iso) {
  if (!iso) return "—";
  const at = new Date(iso);
  const sameDay = at.toDateString() === new Date().toDateString();
  return sameDay ? at.toLocaleTimeString() : at.toLocaleString();
}

// The times a reason carries (the log's, ISO 8601 in UTC: "to start at
// 2026-12-07T08:15:00+00:00") shown as the other times of the page are: local.
const ISO_TIME = /\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})/g;

export function localTimes(text) {
  return text ? String(text).replace(ISO_TIME, (iso) => when(iso)) : text;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function gpuHours(seconds) {
  const hours = seconds / 3600;
  if (hours >= 100) return `${hours.toFixed(0)} GPU-h`;
  if (hours >= 1) return `${hours.toFixed(1)} GPU-h`;
  return `${seconds.toFixed(1)} GPU-s`;
}

export function percent(part, whole) {
  return whole > 0 ? `${Math.round((100 * part) / whole)} %` : "—";
}

/** A horizontal bar, its length set through the CSSOM (the CSP allows no style attributes). */
export function bar(fraction, cls = "") {
  const fillEl = h("span", { class: "bar-fill" });
  fillEl.style.width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
  return h("span", { class: `bar ${cls}` }, fillEl);
}
