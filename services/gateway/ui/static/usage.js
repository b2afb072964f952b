// #/usage?range=24h&by=account: GPU time over time by account, user or GPU model, the cluster's
// utilisation (charts by uPlot, from the charged runs of GET /v1/usage/jobs), and the
// totals by account, user and GPU model, and what runs now have used since their last
// charge (GET /v1/usage). Reloaded on UsageCharged and when a run starts or ends.
//
// Each charged run is spread evenly over [charged_at - seconds, charged_at], at
// gpu_seconds / seconds GPUs (a 0.25 slice counts a quarter): the charts show how
// many GPUs each account or user held, on average, in each slot of the range.

import { api } from "./api.js";
import { bar, empty, fill, gpuHours, h, section } from "./dom.js";

const RANGES = { "15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400 };
const SLOTS = 60;
const BY = { account: "by account", user: "by user", gpu_model: "by GPU model" };
const SHOWN = 6; // groups drawn one by one; the rest add up in "others"
const COLORS = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#6b7280"];

let ctx = null;
let plots = [];
let resize = null;

export async function show(context) {
  ctx = context;
  fill(ctx.root, h("p", { class: "muted" }, "Loading the usage…"));
  await load(ctx);
}

export function hide() {
  for (const plot of plots) plot.destroy();
  plots = [];
  resize?.disconnect();
  resize = null;
}

export async function touched(changes, context) {
  if (changes.usage || changes.nodes) await load(context); // a run starts or ends: what runs now
}

function choices(context) {
  const range = RANGES[context.params.get("range")] ? context.params.get("range") : "24h";
  const by = BY[context.params.get("by")] ? context.params.get("by") : "account";
  return { range, by };
}

async function load(context) {
  const { range, by } = choices(context);
  const until = Date.now() / 1000;
  const since = until - RANGES[range];
  const params = { since: new Date(since * 1000).toISOString() };
  const [totals, runs, nodes] = await Promise.all([api("/v1/usage", { params }), api("/v1/usage/jobs", { params }), api("/v1/nodes")]);
  if (context !== ctx) return;
  hide();
  const gpus = nodes.nodes.filter((n) => n.state === "ready").reduce((sum, n) => sum + n.gpus.length, 0);
  const series = overTime(runs.records, since, until, by);
  const byGroup = section(`GPUs in use ${BY[by]}`, "average over each slot, from the charged runs you may see", chartBox("chart-groups"));
  const utilisation = section("Cluster utilisation", `${gpus} GPUs on ready nodes`, chartBox("chart-util"));
  fill(
    context.root,
    h("div", { class: "view-head" }, h("h1", {}, "Usage"), h("span", { class: "spacer" }), controls(range, by)),
    h("div", { class: "charts" }, byGroup, utilisation),
    h(
      "div",
      { class: "totals" },
      totalsSection("By account", totals.accounts.map((r) => [r.account, r.gpu_seconds, r.jobs])),
      totalsSection("By user", totals.users.map((r) => [`${r.user} (${r.account})`, r.gpu_seconds, r.jobs])),
      totalsSection("By GPU model", totals.gpu_models.map((r) => [r.gpu_model, r.gpu_seconds, r.jobs])),
      totalsSection(
        "Running now, not yet charged",
        (totals.running || []).map((r) => [`${r.user} (${r.account})`, r.gpu_seconds, r.jobs]),
        { kind: "running", none: "Nothing runs now.", note: "since each run's last charge; charged every few minutes and at its end" },
      ),
    ),
  );
  if (!runs.records.length) {
    fill(byGroup.querySelector(".chart"), empty("No GPU time charged in this range."));
    fill(utilisation.querySelector(".chart"), empty("No GPU time charged in this range."));
    return;
  }
  draw(byGroup.querySelector(".chart"), series.xs, series.groups, "GPUs");
  const used = series.xs.map((_, i) => series.groups.reduce((sum, g) => sum + g.values[i], 0));
  const percent = used.map((v) => (gpus ? (100 * v) / gpus : 0));
  draw(utilisation.querySelector(".chart"), series.xs, [{ label: "utilisation %", values: percent }], "%", gpus ? 100 : null);
  resize = new ResizeObserver(() => {
    for (const plot of plots) plot.setSize({ width: plot.root.parentElement.clientWidth, height: plot.height });
  });
  for (const plot of plots) resize.observe(plot.root.parentElement);
}

function controls(range, by) {
  const go = (next) => {
    location.hash = `#/usage?${new URLSearchParams({ range, by, ...next })}`;
  };
  const rangeSelect = h("select", { id: "usage-range", "aria-label": "range" }, Object.keys(RANGES).map((r) => h("option", { value: r }, `last ${r}`)));
  rangeSelect.value = range;
  rangeSelect.addEventListener("change", () => go({ range: rangeSelect.value }));
  const bySelect = h("select", { id: "usage-by", "aria-label": "group by" }, Object.entries(BY).map(([value, label]) => h("option", { value }, label)));
  bySelect.value = by;
  bySelect.addEventListener("change", () => go({ by: bySelect.value }));
  return h("div", { class: "controls" }, rangeSelect, bySelect);
}

function chartBox(id) {
  return h("div", { class: "chart", id });
}

/** The average GPUs each group held in each of SLOTS slots of [since, until). */
export function overTime(records, since, until, by) {
  const width = (until - since) / SLOTS;
  const xs = Array.from({ length: SLOTS }, (_, i) => since + i * width);
  const sums = new Map();
  for (const run of records) {
    const end = Date.parse(run.charged_at) / 1000;
    const start = end - run.seconds;
    const first = Math.max(0, Math.floor((start - since) / width));
    const last = Math.min(SLOTS - 1, Math.floor((end - since) / width));
    for (const [key, gpuSeconds] of parts(run, by)) {
      const rate = run.seconds > 0 ? gpuSeconds / run.seconds : 0;
      if (!sums.has(key)) sums.set(key, new Array(SLOTS).fill(0));
      const values = sums.get(key);
      for (let i = first; i <= last; i++) {
        const overlap = Math.min(end, xs[i] + width) - Math.max(start, xs[i]);
        if (overlap > 0) values[i] += (rate * overlap) / width;
      }
    }
  }
  const ranked = [...sums.entries()].sort((a, b) => total(b[1]) - total(a[1]) || (a[0] < b[0] ? -1 : 1));
  const groups = ranked.slice(0, SHOWN).map(([label, values]) => ({ label, values }));
  if (ranked.length > SHOWN) {
    const rest = ranked.slice(SHOWN).reduce((acc, [, values]) => acc.map((v, i) => v + values[i]), new Array(SLOTS).fill(0));
    groups.push({ label: "others", values: rest });
  }
  return { xs, groups };
}

/** A run's GPU seconds under the groups it counts in: its user, its account, or each
 * GPU model it ran on (a run charged before the split by model counts as "unknown"). */
function parts(run, by) {
  if (by === "user") return [[run.user, run.gpu_seconds]];
  if (by === "account") return [[run.account, run.gpu_seconds]];
  const models = Object.entries(run.gpu_models ?? {});
  return models.length ? models : [["unknown", run.gpu_seconds]];
}

const total = (values) => values.reduce((a, b) => a + b, 0);

function draw(el, xs, groups, unit, max = null) {
  const series = groups.map((group, i) => ({
    label: group.label,
    stroke: COLORS[i % COLORS.length],
    fill: `${COLORS[i % COLORS.length]}22`,
    width: 2,
    paths: window.uPlot.paths.stepped({ align: 1 }),
    value: (_, v) => (v === null ? "—" : `${v.toFixed(2)} ${unit}`),
  }));
  const options = {
    width: el.clientWidth || 600,
    height: 220,
    scales: { x: { time: true }, y: { range: (_, lo, hi) => [0, max ?? Math.max(1, hi * 1.1)] } },
    axes: [{}, { label: unit, size: 56 }],
    series: [{}, ...series],
    legend: { live: true },
  };
  plots.push(new window.uPlot(options, [xs, ...groups.map((g) => g.values)], el));
}

function totalsSection(title, rows, { kind = "charged", none = "Nothing charged.", note = null } = {}) {
  if (!rows.length) return section(title, note, empty(none));
  const most = Math.max(...rows.map(([, seconds]) => seconds));
  const lines = rows
    .slice()
    .sort((a, b) => b[1] - a[1])
    .map(([label, seconds, jobs]) =>
      h("li", { dataset: { key: label } }, h("span", { class: "total-label" }, label), bar(most ? seconds / most : 0), h("span", { class: "total-value" }, `${gpuHours(seconds)} · ${jobs} job${jobs === 1 ? "" : "s"}`)),
    );
  return section(title, note, h("ul", { class: "totals-list", dataset: { totals: kind } }, lines));
}
