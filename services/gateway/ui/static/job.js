// #/jobs/<id>: one job: its state, placement, why it waits (explain), its timeline of
// events from the log (GET /v1/jobs/{id}/events), the GPU time charged, and its logs.
// Reloaded when an event about this job arrives.

import { ApiError, api } from "./api.js";
import { badge, duration, empty, fill, gpuHours, h, jobLink, localTimes, section, table, when } from "./dom.js";

const PENDING = new Set(["submitted", "admitted", "queued"]);
let ctx = null;

export async function show(context) {
  ctx = context;
  fill(ctx.root, h("p", { class: "muted" }, "Loading the job…"));
  await load(ctx);
}

export async function touched(changes, context) {
  const task = `${context.arg}-`; // an array's tasks: <array id>-<index>
  if (changes.jobs.has(context.arg) || [...changes.jobs].some((id) => id.startsWith(task))) await load(context);
}

async function load(context) {
  const id = encodeURIComponent(context.arg);
  let job;
  try {
    job = await api(`/v1/jobs/${id}`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      fill(context.root, h("h1", {}, "Job"), empty(`No job ${context.arg}.`));
      return;
    }
    throw error;
  }
  const [events, explain, logs] = await Promise.all([
    api(`/v1/jobs/${id}/events`).catch(denied),
    PENDING.has(job.state) && !job.array ? api(`/v1/jobs/${id}/explain`).catch(() => null) : null, // a task says why it waits
    job.node ? api(`/v1/jobs/${id}/logs`).catch(denied) : null,
  ]);
  if (context !== ctx) return;
  const trail = events instanceof Error ? events : events.events;
  fill(
    context.root,
    header(job),
    h(
      "div",
      { class: "columns" },
      h("div", {}, job.array ? tasks(job) : placement(job), explain ? why(explain) : null, charged(trail)),
      timeline(trail),
    ),
    logsSection(logs),
  );
}

/** A 403 or 404 shown where the data would be; other errors go to the banner. */
function denied(error) {
  if (error instanceof ApiError && (error.status === 403 || error.status === 404)) return error;
  throw error;
}

function header(job) {
  const ran = job.started_at ? ((job.finished_at ? new Date(job.finished_at) : new Date()) - new Date(job.started_at)) / 1000 : null;
  const facts = [
    ["user", job.user],
    ["account", job.account],
    ["priority", String(job.priority)],
    ["GPUs", `${job.gpus_requested} × ${job.gpu_model.length ? job.gpu_model.join("|") : "any model"}`],
    ["time limit", job.time_limit_s ? duration(job.time_limit_s) : "none"],
    ["submitted", when(job.submitted_at)],
    ["started", when(job.started_at)],
    ["finished", when(job.finished_at)],
    ["ran", duration(ran)],
    ["attempt", String(job.attempt)],
    ["exit code", job.exit_code === null ? "—" : String(job.exit_code)],
  ];
  return h(
    "div",
    { class: "job-head card" },
    h("div", { class: "view-head" }, h("h1", { id: "job-name" }, job.name), h("span", { id: "job-state" }, badge(job.state)), h("code", { class: "muted" }, job.id)),
    job.reason ? h("p", { class: "note" }, localTimes(job.reason)) : null,
    job.command ? h("pre", { class: "command" }, job.command.join(" ")) : null,
    h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v)))),
  );
}

function placement(job) {
  if (!job.placement?.length) return section("Placement", null, empty(job.node ? `${job.node}: GPUs ${job.gpus.join(", ")}` : "Not placed."));
  const rows = job.placement.flatMap((replica, i) =>
    replica.slices.map((slice) =>
      h("tr", { dataset: { node: slice.node, gpu: String(slice.index) } }, h("td", { class: "num" }, String(i)), h("td", {}, replica.host), h("td", {}, `${slice.node} GPU ${slice.index}`), h("td", { class: "num" }, `${slice.milli / 1000}`), h("td", { class: "num" }, `${Math.round(slice.memory_mib / 1024)} GiB`)),
    ),
  );
  return section("Placement", job.state === "running" || job.state === "placed" ? "now" : "last", table(["replica", "host", "GPU", "share", "memory"], rows));
}

/** Shown at most on an array's page: past it, the counts and a line say how many more. */
const TASKS_SHOWN = 1000;

function tasks(job) {
  const { members = [], states } = job.array;
  const counts = Object.entries(states).map(([state, n]) => h("li", { dataset: { state } }, badge(state), ` ${n}`));
  const rows = members.slice(0, TASKS_SHOWN).map((task) =>
    h("tr", { dataset: { task: task.id, state: task.state } }, h("td", {}, jobLink(task.id)), h("td", {}, badge(task.state)), h("td", {}, task.node || "—"), h("td", { class: "num" }, task.exit_code === null ? "—" : String(task.exit_code))),
  );
  const more = members.length > TASKS_SHOWN ? h("p", { class: "muted" }, `and ${members.length - TASKS_SHOWN} more: GET /v1/jobs/${job.id} lists every task`) : null;
  return section("Tasks", `${members.length} in all`, h("ul", { class: "array-states" }, counts), table(["task", "state", "node", "exit code"], rows, { class: "array-tasks" }), more);
}

function why(explain) {
  const verdicts = Object.entries(explain.nodes || {}).map(([node, verdict]) => h("tr", {}, h("td", {}, node), h("td", {}, verdict)));
  return section(
    "Why it waits",
    explain.position ? `position ${explain.position}, ${explain.ahead.length} ahead` : null,
    h("p", {}, explain.reason || "—", explain.detail ? `: ${localTimes(explain.detail)}` : ""),
    h("p", { class: "muted" }, "Estimated start: ", when(explain.estimated_start)),
    verdicts.length ? table(["node", "verdict"], verdicts) : null,
  );
}

/** What each event of the trail says, in a line. */
const SUMMARY = {
  JobSubmitted: (d) => `"${d.spec.name}" by ${d.spec.user} under ${d.spec.account}: ${d.spec.gpus} GPU${d.spec.gpus === 1 ? "" : "s"}`,
  JobArraySubmitted: (d) => `array of ${d.spec.array} tasks by ${d.spec.user}`,
  JobAdmitted: () => "admitted: some node can run it",
  JobRejected: (d) => d.reason,
  JobQueued: (d) => `queued at priority ${d.priority}`,
  JobReserved: (d) => `reserved, to start at ${when(d.start_at)}`,
  JobPlaced: (d) => `on ${d.node} GPU ${d.gpu_indexes.join(", ")} (${d.policy?.name || "policy"}${d.backfilled ? ", backfilled" : ""})`,
  JobStarted: (d) => `running on ${d.node}, pid ${d.pid}`,
  JobPreempted: (d) => `preempted by ${d.by}: ${d.reason}`,
  JobGrown: (d) => `grew: replica${d.replicas.length === 1 ? "" : "s"} ${d.replicas.map((r, i) => `${d.first + i} on ${r.host}`).join(", ")} joined`,
  JobShrunk: (d) => `shrinking for ${d.by} (${d.reason}): replica${d.replicas.length === 1 ? "" : "s"} ${d.replicas.join(", ")} leave`,
  JobCancelRequested: (d) => `cancel asked by ${d.requested_by}`,
  JobCancelled: (d) => d.reason || "cancelled",
  JobFinished: (d) => `${d.outcome}, exit code ${d.exit_code ?? "—"}${d.reason ? `: ${d.reason}` : ""}`,
};

function timeline(trail) {
  if (trail instanceof Error) return section("Timeline", null, empty(trail.message));
  const items = trail
    .filter((event) => event.type !== "UsageCharged")
    .map((event) => {
      const summary = SUMMARY[event.type]?.(event.data) ?? "";
      const outcome = event.type === "JobFinished" ? badge(event.data.outcome) : null;
      return h(
        "li",
        { dataset: { type: event.type, seq: String(event.seq) } },
        h("div", { class: "tl-head" }, h("strong", {}, event.type), outcome, h("span", { class: "spacer" }), h("time", { datetime: event.at, class: "muted" }, when(event.at))),
        h("div", { class: "tl-summary" }, summary),
        h("div", { class: "muted small" }, `#${event.seq} by ${event.by}${event.principal ? `, asked by ${event.principal}` : ""}`),
      );
    });
  return section("Timeline", "from the log", h("ol", { class: "timeline", id: "timeline" }, items));
}

function charged(trail) {
  if (trail instanceof Error) return null;
  const charges = trail.filter((event) => event.type === "UsageCharged");
  if (!charges.length) return section("Usage", null, empty("No GPU time charged yet."));
  const total = charges.reduce((sum, e) => sum + e.data.gpu_milli_seconds / 1000, 0);
  const rows = charges.map((e) =>
    h(
      "tr",
      {},
      h("td", { class: "num" }, String(e.data.attempt)),
      h("td", {}, e.data.period_end ? "interim" : "final"),
      h("td", {}, duration(e.data.seconds)),
      h("td", {}, gpuHours(e.data.gpu_milli_seconds / 1000)),
      h("td", {}, Object.keys(e.data.by_model || {}).join(", ")),
    ),
  );
  return section("Usage", `${gpuHours(total)} in all`, table(["attempt", "charge", "time", "GPU time", "models"], rows));
}

function logsSection(logs) {
  if (logs === null) return section("Logs", null, empty("It has not run on a node yet."));
  if (logs instanceof Error) return section("Logs", null, empty(logs.message));
  return section(
    "Logs",
    `${logs.node}, attempt ${logs.attempt ?? "—"}`,
    h("h3", {}, "stdout"),
    h("pre", { class: "log", id: "stdout" }, logs.stdout || "(empty)"),
    h("h3", {}, "stderr"),
    h("pre", { class: "log", id: "stderr" }, logs.stderr || "(empty)"),
  );
}
