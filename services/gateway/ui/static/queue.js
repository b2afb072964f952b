// #/queue: pending jobs in queue order (GET /v1/queue) with each one's reason and
// estimated start (GET /v1/jobs/{id}/explain), and the fair-share standing of each
// account (shares from /v1/accounts, usage from /v1/usage, factors from the queue).

import { api, jobOwners, pool } from "./api.js";
import { bar, empty, fill, gpuHours, h, jobLink, localTimes, section, table, when } from "./dom.js";

/** Explanations asked for at most this many jobs at the head of the queue. */
const EXPLAINED = 50;
let ctx = null;

export async function show(context) {
  ctx = context;
  fill(ctx.root, h("p", { class: "muted" }, "Loading the queue…"));
  await load(ctx);
}

export async function touched(changes, context) {
  if (changes.queue || changes.usage) await load(context);
}

async function load(context) {
  const [queue, accounts, usage, booked] = await Promise.all([
    api("/v1/queue"),
    api("/v1/accounts").catch(() => ({ accounts: [] })),
    api("/v1/usage").catch(() => ({ accounts: [] })),
    api("/v1/reservations").catch(() => ({ reservations: [] })),
  ]);
  const head = queue.jobs.slice(0, EXPLAINED);
  const [explains, owners] = await Promise.all([
    pool(head, 6, (job) => api(`/v1/jobs/${encodeURIComponent(job.id)}/explain`)),
    jobOwners(head.map((job) => job.id)),
  ]);
  if (context !== ctx) return;
  const explained = new Map(head.map((job, i) => [job.id, explains[i] instanceof Error ? null : explains[i]]));
  fill(
    context.root,
    h("div", { class: "view-head" }, h("h1", {}, "Queue"), h("span", { class: "muted" }, `${queue.jobs.length} pending, in the order placement takes them`)),
    queueTable(queue, explained, owners),
    reservationTable(booked.reservations),
    fairShare(queue, accounts.accounts, usage.accounts),
  );
}

function queueTable(queue, explained, owners) {
  const w = queue.weights;
  const note = `priority points = priority + age × ${w.age} + fair share × ${w.fair_share} + size × ${w.size}`;
  if (!queue.jobs.length) return section("Pending jobs", note, empty("Nothing waits: every admitted job is placed."));
  const rows = queue.jobs.map((job) => {
    const why = explained.get(job.id);
    const owner = owners.get(job.id);
    const reason = why?.reason ? `${why.reason}${why.detail ? `: ${why.detail}` : ""}` : job.reason || "its turn";
    return h(
      "tr",
      { dataset: { job: job.id } },
      h("td", { class: "num" }, String(job.position)),
      h("td", {}, jobLink(job.id), owner ? h("div", { class: "muted small" }, owner.name) : null),
      h("td", {}, job.user),
      h("td", {}, job.account),
      h("td", { class: "num" }, String(job.priority)),
      h("td", { class: "num", title: `age ${job.age.toFixed(2)} · fair share ${job.fair_share.toFixed(2)} · size ${job.size.toFixed(2)}` }, job.points.toFixed(1)),
      h("td", { class: "reason" }, localTimes(reason)),
      h("td", {}, why ? when(why.estimated_start) : "—"),
      h("td", { class: "num" }, why ? String(why.ahead.length) : "—"),
    );
  });
  return section(
    "Pending jobs",
    note,
    table(["#", "job", "user", "account", "priority", "points", "reason", "estimated start", "ahead"], rows, { class: "queue-table" }),
  );
}

function fairShare(queue, accounts, usage) {
  const names = new Set([...accounts.map((a) => a.name), ...usage.map((u) => u.account), ...queue.jobs.map((j) => j.account)]);
  if (!names.size) return section("Fair share by account", null, empty("No account has used GPU time or queued a job yet."));
  const byName = new Map(accounts.map((a) => [a.name, a]));
  const used = new Map(usage.map((u) => [u.account, u.gpu_seconds]));
  const totalShares = accounts.reduce((sum, a) => sum + (a.parent ? 0 : a.shares), 0);
  const totalUsed = usage.reduce((sum, u) => sum + u.gpu_seconds, 0);
  const rows = [...names].sort().map((name) => {
    const account = byName.get(name);
    const pending = queue.jobs.filter((j) => j.account === name);
    const factor = pending.length ? Math.max(...pending.map((j) => j.fair_share)) : null;
    const share = account && !account.parent && totalShares ? account.shares / totalShares : null;
    const usedShare = totalUsed ? (used.get(name) || 0) / totalUsed : 0;
    return h(
      "tr",
      { dataset: { account: name } },
      h("td", {}, account?.parent ? `${account.parent} › ${name}` : name),
      h("td", { class: "num" }, account ? String(account.shares) : "—"),
      h("td", {}, share === null ? "—" : `${Math.round(share * 100)} %`),
      h("td", {}, gpuHours(used.get(name) || 0)),
      h("td", { class: "share" }, bar(usedShare), ` ${Math.round(usedShare * 100)} %`),
      h("td", { class: "num" }, factor === null ? "—" : factor.toFixed(2)),
      h("td", { class: "num" }, String(pending.length)),
    );
  });
  return section(
    "Fair share by account",
    "usage is what your token may see; the factor (0–1) is the queue's, for accounts with pending jobs",
    table(["account", "shares", "of top-level shares", "GPU time used", "of usage", "fair-share factor", "pending"], rows),
  );
}

// Advance reservations (docs/reservations.md): what holds GPUs for whom and when, the
// reason jobs wait with `Reservation` or `ReqNodeNotAvail`.
function reservationTable(reservations) {
  const note = "GPUs held for a window; jobs that end before a start still use them";
  if (!reservations.length) return section("Reservations", note, empty("No advance reservation."));
  const rows = reservations.map((r) =>
    h(
      "tr",
      { dataset: { reservation: r.name } },
      h("td", {}, h("strong", {}, r.name), r.description ? h("div", { class: "muted small" }, r.description) : null),
      h("td", {}, r.flags.includes("maint") ? "maintenance" : r.state),
      h("td", {}, when(r.start)),
      h("td", {}, when(r.end)),
      h("td", { class: "num" }, String(r.gpus.length)),
      h("td", {}, r.nodes.join(", ")),
      h("td", {}, [...r.users, ...r.accounts.map((a) => `account ${a}`)].join(", ") || "nobody"),
    ),
  );
  return section("Reservations", note, table(["Name", "State", "Start", "End", "GPUs", "Nodes", "For"], rows));
}
