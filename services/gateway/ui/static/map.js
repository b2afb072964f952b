// #/map: every node and GPU (GET /v1/nodes): pool, the slices held and by which jobs,
// cordoned and lost nodes, GPUs out of service after a failed health check (docs/faults.md), and the advance reservation that holds a GPU (GET /v1/reservations). Reloaded when an event takes or gives back GPUs or names a node.

import { api, jobOwners } from "./api.js";
import { badge, bar, fill, h, jobLink, percent, when } from "./dom.js";

let ctx = null;

export async function show(context) {
  ctx = context;
  fill(ctx.root, h("p", { class: "muted" }, "Loading the nodes…"));
  await load(ctx);
}

export async function touched(changes, context) {
  if (changes.nodes) await load(context);
}

async function load(context) {
  const [{ nodes }, { reservations }] = await Promise.all([
    api("/v1/nodes"),
    api("/v1/reservations").catch(() => ({ reservations: [] })),
  ]);
  const held = nodes.flatMap((node) => node.gpus.flatMap((gpu) => holdersOf(gpu).map((x) => x.job_id)));
  const owners = await jobOwners(held);
  if (context !== ctx) return; // the user went elsewhere meanwhile
  render(context.root, nodes, owners, reservedGpus(reservations));
}

/** "node/index" -> the advance reservation that holds the GPU (docs/reservations.md). */
function reservedGpus(reservations) {
  const reserved = new Map();
  for (const r of reservations) for (const gpu of r.gpus) reserved.set(`${gpu.node}/${gpu.index}`, r);
  return reserved;
}

/** Who holds the GPU: `holders`, or the one `job_id` of an older read model. */
function holdersOf(gpu) {
  if (gpu.holders?.length) return gpu.holders;
  return gpu.job_id ? [{ job_id: gpu.job_id, milli: 1000, memory_mib: gpu.memory_mib }] : [];
}

function render(root, nodes, owners, reserved) {
  let gpus = 0;
  let busy = 0;
  let milli = 0;
  for (const node of nodes) {
    if (node.state !== "ready") continue;
    gpus += node.gpus.length;
    busy += node.gpus.filter((gpu) => holdersOf(gpu).length).length;
    milli += node.gpus.reduce((sum, gpu) => sum + gpu.milli_allocated, 0);
  }
  const count = (state) => nodes.filter((node) => node.state === state).length;
  const cordoned = nodes.filter((node) => node.cordoned !== null).length;
  const failed = nodes.flatMap((node) => node.gpus.filter((gpu) => gpu.unhealthy)).length;
  const active = [...reserved.values()].filter((r) => r.started);
  const activeGpus = new Set([...reserved].filter(([, r]) => r.started).map(([key]) => key)).size;
  fill(
    root,
    h("div", { class: "view-head" }, h("h1", {}, "GPU map"), h("span", { class: "muted" }, "nodes, GPUs and who holds them, live")),
    h(
      "div",
      { class: "tiles" },
      tile("Nodes", `${count("ready")} ready`, count("lost") ? `${count("lost")} lost` : "none lost"),
      tile("Cordoned", String(cordoned), cordoned ? "take no new work" : "all take work"),
      tile("Out of service", `${failed} GPU(s)`, failed ? "failed a health check" : "all GPUs healthy", failed ? "warn" : ""),
      tile("GPUs in use", `${busy} / ${gpus}`, "on ready nodes"),
      tile("Allocated", percent(milli, gpus * 1000), bar(gpus ? milli / (gpus * 1000) : 0), "util"),
      tile("Reserved", `${reserved.size} GPU(s)`, reserved.size ? `${activeGpus} in ${new Set(active.map((r) => r.name)).size} active reservation(s)` : "no advance reservation"),
    ),
    nodes.length ? grouped(nodes, owners, reserved) : h("p", { class: "empty muted" }, "No node has registered yet."),
  );
}

// Nodes grouped by their place in the topology (docs/topology.md): a section per domain
// of the loosest level, nodes sorted by their domains from the loosest level down.
function grouped(nodes, owners, reserved) {
  const places = (node) => Object.entries(node.topology || {});
  const named = nodes.find((node) => places(node).length);
  if (!named) return h("div", { class: "nodes" }, nodes.map((node) => nodeCard(node, owners, reserved)));
  const level = places(named)[places(named).length - 1][0];
  const path = (node) => places(node).map(([, domain]) => domain).reverse().join("/");
  const sorted = [...nodes].sort((a, b) => path(a).localeCompare(path(b)) || a.name.localeCompare(b.name));
  const groups = new Map();
  for (const node of sorted) {
    const domain = (node.topology || {})[level] || "";
    if (!groups.has(domain)) groups.set(domain, []);
    groups.get(domain).push(node);
  }
  return h(
    "div",
    { class: "domains" },
    [...groups].map(([domain, members]) =>
      h(
        "section",
        { class: "domain", dataset: { level, domain } },
        h("h3", { class: "domain-head" }, domain ? `${level} ${domain}` : `no ${level}`, h("span", { class: "muted" }, ` · ${members.length} node(s)`)),
        h("div", { class: "nodes" }, members.map((node) => nodeCard(node, owners, reserved))),
      ),
    ),
  );
}

function tile(title, value, note, cls = "") {
  return h("div", { class: `tile card ${cls}` }, h("div", { class: "tile-title muted" }, title), h("div", { class: "tile-value" }, value), h("div", { class: "tile-note muted" }, note));
}

function nodeCard(node, owners, reserved) {
  const models = [...new Set(node.gpus.map((gpu) => gpu.model))].join(", ");
  const labels = Object.entries(node.labels || {}).map(([k, v]) => h("span", { class: "chip" }, `${k}=${v}`));
  const places = Object.entries(node.topology || {}).map(([level, domain]) => h("span", { class: "chip topology" }, `${level} ${domain}`));
  const classes = ["node", "card", `node-${node.state}`, node.cordoned !== null ? "node-cordoned" : ""];
  return h(
    "article",
    { class: classes.join(" "), dataset: { node: node.name } },
    h(
      "div",
      { class: "node-head" },
      h("h2", {}, node.name),
      badge(node.state),
      node.cordoned !== null ? h("span", { class: "badge state-cordoned" }, "cordoned") : null,
      node.simulated ? h("span", { class: "chip" }, "simulated") : null,
      node.lends_remote_vgpu ? h("span", { class: "chip" }, "lends remote vGPU") : null,
      h("span", { class: "spacer" }),
      h("span", { class: "muted" }, `${node.gpus.length} × ${models || "no GPU"} · isolation ${node.isolation}`),
    ),
    node.cordoned !== null ? h("p", { class: "note" }, "Cordoned: ", node.cordoned || "no reason given") : null,
    node.state === "lost" ? h("p", { class: "note warn" }, "Lost: its agent stopped sending heartbeats; its jobs were requeued.") : null,
    labels.length || places.length ? h("div", { class: "labels" }, places, labels) : null,
    h("div", { class: "gpus" }, node.gpus.map((gpu) => gpuTile(node, gpu, owners, reserved.get(`${node.name}/${gpu.index}`)))),
  );
}

function gpuTile(node, gpu, owners, reservation) {
  const holders = holdersOf(gpu);
  const maint = reservation?.flags.includes("maint");
  const booked = reservation
    ? h(
        "div",
        { class: `reserved-by ${reservation.started ? "active" : "pending"}${maint ? " maint" : ""}`, dataset: { reservation: reservation.name } },
        maint ? "maintenance " : "reserved ",
        h("strong", {}, reservation.name),
        reservation.started ? ` until ${when(reservation.end)}` : ` from ${when(reservation.start)}`,
      )
    : null;
  const fault = gpu.unhealthy
    ? h(
        "div",
        { class: "fault" },
        h("strong", {}, "out of service"),
        ` since ${when(gpu.unhealthy.at)}: ${gpu.unhealthy.check}`,
        gpu.unhealthy.evidence ? ` (${gpu.unhealthy.evidence})` : "",
      )
    : null;
  return h(
    "div",
    {
      class: `gpu ${holders.length ? "busy" : "idle"} pool-${gpu.pool}${reservation ? " reserved" : ""}${gpu.unhealthy ? " unhealthy" : ""}`,
      dataset: { node: node.name, gpu: String(gpu.index) },
      title: gpu.uuid,
    },
    h("div", { class: "gpu-head" }, h("strong", {}, `GPU ${gpu.index}`), h("span", { class: `chip pool` }, gpu.pool)),
    booked,
    fault,
    h("div", { class: "gpu-model muted" }, `${gpu.model} · ${Math.round(gpu.memory_mib / 1024)} GiB`),
    bar(gpu.milli_allocated / 1000),
    holders.length
      ? h("ul", { class: "holders" }, holders.map((held) => holder(held, owners)))
      : gpu.unhealthy
        ? null
        : h("div", { class: "idle-label muted" }, "idle"),
  );
}

function holder(held, owners) {
  const owner = owners.get(held.job_id);
  return h(
    "li",
    { dataset: { job: held.job_id } },
    jobLink(held.job_id),
    owner ? h("span", { class: "holder-who" }, owner.user, " · ", owner.name) : null,
    held.milli < 1000 ? h("span", { class: "chip" }, `${held.milli / 1000} GPU`) : null,
  );
}
