// #/jobs?state=&user=&account=: the newest jobs that match the filters (GET /v1/jobs).
// An event about a job re-reads that job only (GET /v1/jobs/{id}) and puts its row in,
// updates it or takes it out; a burst of many jobs reloads the list.
//
// Without filters in the route, a user who is not an operator sees their own jobs:
// the event stream carries only the events of the jobs they may follow.

import { ApiError, api, remember } from "./api.js";
import { badge, duration, empty, fill, h, jobLink, localTimes, section, when } from "./dom.js";

const STATES = ["submitted", "admitted", "queued", "placed", "running", "succeeded", "failed", "cancelled", "timed_out", "rejected"];
const LIMIT = 200;
/** More touched jobs than this in one batch: reload the list rather than each row. */
const ROW_BY_ROW = 25;
let ctx = null;
let tbody = null;
let filters = {};

export async function show(context) {
  ctx = context;
  filters = filtersOf(context);
  tbody = h("tbody");
  fill(
    ctx.root,
    h("div", { class: "view-head" }, h("h1", {}, "Jobs"), h("span", { class: "muted", id: "jobs-count" })),
    filterForm(filters),
    section("Newest first", null, h("table", { class: "jobs-table" }, h("thead", {}, headRow()), tbody)),
  );
  await load(ctx);
}

function filtersOf(context) {
  const p = context.params;
  if (![...p.keys()].length) return { state: "", user: context.me.operator ? "" : context.me.name, account: "" };
  return { state: p.get("state") || "", user: p.get("user") || "", account: p.get("account") || "" };
}

function filterForm(current) {
  const state = h("select", { name: "state", id: "filter-state" }, h("option", { value: "" }, "any state"), STATES.map((s) => h("option", { value: s }, s.replace("_", " "))));
  state.value = current.state;
  const user = h("input", { name: "user", id: "filter-user", placeholder: "any user", value: current.user, spellcheck: "false" });
  const account = h("input", { name: "account", id: "filter-account", placeholder: "any account", value: current.account, spellcheck: "false" });
  const form = h(
    "form",
    { class: "filters card", method: "post" },
    h("label", {}, "State ", state),
    h("label", {}, "User ", user),
    h("label", {}, "Account ", account),
    h("button", { type: "submit" }, "Filter"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams({ state: state.value, user: user.value.trim(), account: account.value.trim() });
    location.hash = `#/jobs?${query}`; // empty values kept: "every user" is a choice too
  });
  return form;
}

function headRow() {
  return h("tr", {}, ["job", "name", "user", "account", "state", "GPUs", "where", "submitted", "ran", "reason"].map((t) => h("th", {}, t)));
}

async function load(context) {
  const params = { ...filters, limit: LIMIT };
  let page = await api("/v1/jobs", { params });
  if (page.total > LIMIT) page = await api("/v1/jobs", { params: { ...params, offset: page.total - LIMIT } });
  if (context !== ctx) return;
  remember(page.jobs);
  tbody.replaceChildren(...page.jobs.slice().reverse().map(row));
  count(page.total);
}

function count(total) {
  const shown = tbody.children.length;
  const el = document.getElementById("jobs-count");
  if (el) el.textContent = total > shown ? `the newest ${shown} of ${total}` : `${shown} job${shown === 1 ? "" : "s"}`;
  const after = tbody.parentElement.nextElementSibling;
  if (after?.classList.contains("empty")) after.remove();
  if (!shown) tbody.parentElement.after(empty("No job matches these filters."));
}

export async function touched(changes, context) {
  if (!changes.jobs.size) return;
  if (changes.jobs.size > ROW_BY_ROW) return load(context);
  for (const id of changes.jobs) {
    let job = null;
    try {
      job = await api(`/v1/jobs/${encodeURIComponent(id)}`);
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404)) throw error;
    }
    if (context !== ctx) return;
    const old = tbody.querySelector(`tr[data-job-id="${CSS.escape(id)}"]`);
    if (job && !job.array && matches(job)) {
      remember([job]);
      if (old) old.replaceWith(row(job));
      else tbody.prepend(row(job));
    } else old?.remove();
  }
  count(tbody.children.length);
}

function matches(job) {
  return (!filters.state || job.state === filters.state) && (!filters.user || job.user === filters.user) && (!filters.account || job.account === filters.account);
}

function row(job) {
  const started = job.started_at ? new Date(job.started_at) : null;
  const ended = job.finished_at ? new Date(job.finished_at) : new Date();
  const models = job.gpu_model.length ? job.gpu_model.join("|") : "any";
  return h(
    "tr",
    { dataset: { jobId: job.id, state: job.state } },
    h("td", {}, jobLink(job.id)),
    h("td", { class: "name" }, job.name),
    h("td", {}, job.user),
    h("td", {}, job.account),
    h("td", {}, badge(job.state)),
    h("td", {}, `${job.gpus_requested} × ${models}`),
    h("td", {}, job.node ? `${job.node}: ${job.gpus.join(", ")}` : "—"),
    h("td", {}, when(job.submitted_at)),
    h("td", {}, started ? duration((ended - started) / 1000) : "—"),
    h("td", { class: "reason muted" }, localTimes(job.reason) || ""),
  );
}
