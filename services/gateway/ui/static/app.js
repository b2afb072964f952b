// The dashboard's shell: login, the top bar, hash routing between the views, and the
// event stream that tells the visible view what to refresh (docs/dashboard.md).

import { ApiError, Unauthorized, api, onUnauthorized, principal, projected, token } from "./api.js";
import { fill, h } from "./dom.js";
import * as job from "./job.js";
import * as jobs from "./jobs.js";
import * as map from "./map.js";
import * as queue from "./queue.js";
import { EventStream } from "./sse.js";
import * as usage from "./usage.js";

const VIEWS = { map, queue, jobs, job, usage };
const $ = (id) => document.getElementById(id);

// --- what an event touches ----------------------------------------------------------

/** Job events that change what the queue shows (positions, reasons, estimates). */
const QUEUE_TYPES = new Set([
  "JobSubmitted", "JobArraySubmitted", "JobAdmitted", "JobRejected", "JobQueued", "JobReserved",
  "JobPlaced", "JobPreempted", "JobCancelRequested", "JobCancelled", "JobFinished",
  "JobGrown", "JobShrunk",
]);
/** Job events that take or give back GPUs. */
const NODE_TYPES = new Set([
  "JobPlaced", "JobPreempted", "JobCancelled", "JobFinished", "JobGrown", "JobShrunk",
]);

function emptyChanges() {
  return { jobs: new Set(), nodes: false, queue: false, usage: false, seq: 0 };
}

/** Note in `changes` what the CloudEvent `cloud` touches. */
export function touch(changes, cloud) {
  const type = cloud.type.split(".")[3] || cloud.type; // io.gpuloom.job.JobFinished.v2
  const slash = (cloud.subject || "").indexOf("/");
  const aggregate = slash < 0 ? cloud.subject : cloud.subject.slice(0, slash);
  const id = slash < 0 ? "" : cloud.subject.slice(slash + 1);
  changes.seq = Math.max(changes.seq, Number(cloud.gpuloomseq) || 0);
  if (aggregate === "job") {
    changes.jobs.add(id);
    if (QUEUE_TYPES.has(type)) changes.queue = true;
    if (NODE_TYPES.has(type)) changes.nodes = true;
    if (type === "UsageCharged") changes.usage = true;
  } else if (aggregate === "node" || aggregate === "reservation") {
    changes.nodes = true; // a reservation holds GPUs of the map, and its jobs wait in the queue
    changes.queue = true;
  } else if (aggregate !== "audit") {
    changes.queue = true; // accounts, queue policy, priority classes, limits
  }
  return changes;
}

// --- refreshing, debounced ----------------------------------------------------------

const QUIET_MS = 250; // refresh once events pause this long...
const AT_MOST_MS = 1500; // ...or at the latest this long after the first of a burst
let changes = emptyChanges();
let quietTimer = null;
/** Refreshes in a row that found the rows behind the stream; past RETRIES_BEHIND (about
 * 30 s: a projector that is down), the next event refreshes the page. */
let behind = 0;
const RETRIES_BEHIND = 10;
let burstTimer = null;

function eventArrived(cloud) {
  touch(changes, cloud);
  clearTimeout(quietTimer);
  quietTimer = setTimeout(flush, QUIET_MS);
  burstTimer ??= setTimeout(flush, AT_MOST_MS);
}

async function flush() {
  clearTimeout(quietTimer);
  clearTimeout(burstTimer);
  quietTimer = burstTimer = null;
  const batch = changes;
  changes = emptyChanges();
  const caughtUp = await projected(batch.seq); // the rows the API reads hold these events
  const view = current;
  if (view?.module.touched) await guard(view.module.touched(batch, view.ctx));
  behind = caughtUp ? 0 : behind + 1;
  if (!caughtUp && behind <= RETRIES_BEHIND) {
    // the rows lag behind the stream (a busy projector): refresh again for the same
    // events, or the page would show them stale until the next event came
    merge(changes, batch);
    quietTimer ??= setTimeout(flush, QUIET_MS);
  }
}

/** Add what `batch` touched to `into`. */
function merge(into, batch) {
  for (const id of batch.jobs) into.jobs.add(id);
  into.nodes ||= batch.nodes;
  into.queue ||= batch.queue;
  into.usage ||= batch.usage;
  into.seq = Math.max(into.seq, batch.seq);
}

// --- views --------------------------------------------------------------------------

let current = null; // { name, module, ctx }
let me = null;
let opened = false; // the stream has opened since the login

function parseRoute() {
  const [path, query = ""] = location.hash.replace(/^#\/?/, "").split("?");
  const [name = "map", ...rest] = path.split("/");
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : null;
  if (name === "jobs" && arg) return { name: "job", arg, params: new URLSearchParams(query) };
  return { name: VIEWS[name] ? name : "map", arg: null, params: new URLSearchParams(query) };
}

async function route() {
  if (!token.get()) return;
  const { name, arg, params } = parseRoute();
  const root = h("div", { class: `view view-${name}`, dataset: { view: name } });
  fill($("view"), root);
  current?.module.hide?.();
  const ctx = { root, me, arg, params };
  current = { name, module: VIEWS[name], ctx };
  for (const a of document.querySelectorAll("nav.views a")) {
    const active = a.dataset.view === name || (name === "job" && a.dataset.view === "jobs");
    a.classList.toggle("active", active);
    if (active) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  await guard(current.module.show(ctx));
}

/** Run a view's load; an API error shows in the banner, a 401 has its own handler. */
async function guard(promise) {
  try {
    await promise;
    $("banner").hidden = true;
  } catch (error) {
    if (error instanceof Unauthorized) return;
    $("banner").textContent =
      error instanceof ApiError ? `The gateway answered ${error.status}: ${error.message}` : `${error.message || error}`;
    $("banner").hidden = false;
  }
}

// --- the event stream and its indicator -------------------------------------------

const stream = new EventStream({
  onEvent: eventArrived,
  onOpen: (after, fresh) => {
    // restarted from the log's end after `slow` or `gone`: reload what shows (the first
    // start needs none: the view loaded as the stream opened)
    if (fresh && opened && current) route();
    opened = true;
  },
  onStatus: (state, why = "") => {
    $("live").dataset.state = state;
    $("live-label").textContent = state;
    $("live").title = why || "the event stream (/v1/events)";
  },
});

// --- login --------------------------------------------------------------------------

function showLogin(reason) {
  stream.stop();
  current?.module.hide?.();
  current = null;
  $("topbar").hidden = true;
  $("app").hidden = true;
  $("login").hidden = false;
  $("login-error").hidden = !reason;
  $("login-error").textContent = reason ? `The gateway refused the token: ${reason}` : "";
  $("token").value = "";
  $("token").focus();
}

function enter() {
  me = principal();
  $("login").hidden = true;
  $("topbar").hidden = false;
  $("app").hidden = false;
  fill(
    $("who"),
    h("span", { class: "who-name", id: "who-name" }, me.name),
    me.operator ? h("span", { class: "chip" }, "operator") : null,
  );
  opened = false;
  stream.start(); // first, so that no event falls between the tables and the stream
  route();
}

async function login(event) {
  event.preventDefault();
  const value = $("token").value.trim();
  if (!value) return;
  $("login-submit").disabled = true;
  token.set(value);
  try {
    await api("/v1/nodes"); // any authenticated route: does the gateway take this token?
    enter();
  } catch (error) {
    if (!(error instanceof Unauthorized)) enter(); // e.g. 503 while NATS is away: the banner says
  } finally {
    $("login-submit").disabled = false;
  }
}

onUnauthorized(showLogin);
$("login-form").addEventListener("submit", login);
$("logout").addEventListener("click", () => {
  token.clear();
  showLogin();
});
window.addEventListener("hashchange", route);
if (token.get()) enter();
else showLogin();
