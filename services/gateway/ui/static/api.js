// Calls to the gateway's /v1 API with the bearer token of this tab.
//
// The token lives in sessionStorage (this tab, until it closes) and goes in the
// Authorization header only: never in a URL, a cookie or the page. A 401 anywhere
// sends the user back to the login form with the gateway's reason.

const KEY = "gpuloom.token";

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

/** The API refused the token (401); `detail` is the gateway's reason. */
export class Unauthorized extends Error {}

/** Any other error answer: `status` and the problem's `detail`. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

let unauthorized = () => {};
/** What to do on a 401 (app.js: back to the login form). */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

export function authHeaders(extra = {}) {
  const value = token.get();
  return value ? { ...extra, Authorization: `Bearer ${value}` } : { ...extra };
}

/** The `detail` of an RFC 9457 problem answer, else the status line. */
export async function problemDetail(response) {
  try {
    const doc = await response.json();
    if (doc && typeof doc.detail === "string") return doc.detail;
  } catch {
    // not JSON
  }
  return `${response.status} ${response.statusText}`;
}

export function refused(detail) {
  token.clear();
  unauthorized(detail);
  return new Unauthorized(detail);
}

/** GET (or `method`) `path`, as JSON; throws Unauthorized or ApiError. */
export async function api(path, { method = "GET", body, params } = {}) {
  const query = params ? `?${new URLSearchParams(clean(params))}` : "";
  const response = await fetch(`${path}${query}`, {
    method,
    headers: authHeaders({ Accept: "application/json", ...(body ? { "Content-Type": "application/json" } : {}) }),
    body: body ? JSON.stringify(body) : undefined,
    cache: "no-store",
    credentials: "omit",
  });
  if (response.status === 401) throw refused(await problemDetail(response));
  if (!response.ok) throw new ApiError(response.status, await problemDetail(response));
  return response.json();
}

function clean(params) {
  return Object.entries(params).filter(([, value]) => value !== undefined && value !== null && value !== "");
}

/** Who the token names, read from its payload, for display only: the gateway verifies
 *  the signature on every call and decides what the caller may see. */
export function principal(value = token.get()) {
  try {
    const payload = value.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const claims = JSON.parse(atob(payload.padEnd(payload.length + ((4 - (payload.length % 4)) % 4), "=")));
    const name = claims.sub || claims.preferred_username || claims.email || "?";
    const roles = Array.isArray(claims.roles) ? claims.roles : [];
    return { name: String(name), roles: roles.map(String), operator: roles.includes("operator") };
  } catch {
    return { name: "?", roles: [], operator: false };
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Wait (bounded) until the gateway's read model holds the log up to `seq`: an event
 *  arrives on the stream before the gateway's projection has written it to the rows
 *  the API reads. /healthz says how far the projection has written. */
export async function projected(seq, timeoutMs = 3000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      const response = await fetch("/healthz", { cache: "no-store", credentials: "omit" });
      if (response.ok && (await response.json()).projection_seq >= seq) return true;
    } catch {
      // the gateway is away: the stream will say so
    }
    await sleep(100);
  }
  return false;
}

/** Map `items` through async `fn`, at most `limit` at a time, in order. */
export async function pool(items, limit, fn) {
  const results = new Array(items.length);
  let next = 0;
  async function worker() {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i]).catch((error) => error);
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}

// Names and owners of jobs, which never change: asked once per job.
const owners = new Map();

export function remember(jobs) {
  for (const job of jobs) owners.set(job.id, { name: job.name, user: job.user, account: job.account });
}

/** id -> {name, user, account} for `ids` (those the API does not know are left out). */
export async function jobOwners(ids) {
  const missing = [...new Set(ids)].filter((id) => !owners.has(id));
  await pool(missing, 6, async (id) => remember([await api(`/v1/jobs/${encodeURIComponent(id)}`)]));
  return owners;
}
