// A job's spec and records (result, reproducibility record) as <dt>/<dd> pairs.

import { h, num, when } from "./dom.js";

const SPEC_FIELDS = (
  "recipe strategy devices nodes accelerator gpu_memory_gb epochs batch_size lr optimizer seed " +
  "precision priority max_attempts timeout_s checkpoint_every"
).split(" ");
// What a script job leaves to its own arguments.
const RECIPE_ONLY = new Set("epochs batch_size lr optimizer precision checkpoint_every".split(" "));

/** The spec as a user reads it: a script's command, the fields it uses, where it ran. */
export function specOf(job) {
  const script = job.entrypoint !== null && job.entrypoint !== undefined;
  const fields = SPEC_FIELDS.filter((k) => !(script && RECIPE_ONLY.has(k)));
  const spec = Object.fromEntries(fields.map((k) => [k, job[k]]));
  if (!(job.nodes > 1)) spec.nodes = null; // one box: not worth a line
  return {
    owner: job.owner,
    entrypoint: script ? job.entrypoint.join(" ") : null,
    ...spec,
    params: script ? null : job.params,
    package: job.code,
    data: job.data,
    requirements: job.requirements?.join(" · "),
    attempt: `${job.attempt} of ${job.max_attempts}`,
    worker: job.worker_id,
    devices_held: job.assigned_devices,
    nodes_held: nodeList(job.node_list),
    queue_position: job.queue_position,
    created: when(job.created_at),
    started: when(job.started_at),
    finished: when(job.finished_at),
  };
}

/** A job across boxes: each node's worker and devices, one a line; null for one box. */
function nodeList(nodes) {
  if (!nodes?.length) return null;
  return h(
    "ul",
    { class: "nodes", id: "job-nodes" },
    nodes.map((n) =>
      h(
        "li",
        { "data-node": n.node },
        `node ${n.node} · ${n.worker_id} · devices ${n.devices.join(", ")}`,
      ),
    ),
  );
}

/** <dt>/<dd> pairs; nested values as compact JSON, elements as they are. */
export function pairs(record) {
  return Object.entries(record)
    .filter(([, v]) => v !== null && v !== undefined)
    .flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, readable(v))]);
}

function readable(value) {
  if (value instanceof Node) return value;
  if (typeof value === "object") return JSON.stringify(value);
  return typeof value === "number" ? num(value, 6) : String(value);
}
