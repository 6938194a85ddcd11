// The submit form, generated from the schemas the server publishes: each recipe's
// params JSON Schema (GET /api/v1/recipes) and the JobCreate schema (/openapi.json).
// A job runs a recipe, or your own script from an uploaded package (GET /api/v1/blobs).
// Validation is the server's: a 422 is shown next to the fields it names.

import { api, fieldOf, openapi } from "./api.js";
import { fill, h, num, when } from "./dom.js";
import { fieldFor } from "./schema.js";

export function submitView(root) {
  const stop = new AbortController();
  fill(root, h("h2", {}, "Submit a job"), h("p", { class: "muted" }, "Loading the schemas…"));
  const blobs = api.get("/blobs?limit=200", { signal: stop.signal });
  Promise.all([api.get("/recipes", { signal: stop.signal }), openapi(), blobs])
    .then(([recipes, doc, stored]) => {
      if (!stop.signal.aborted) {
        fill(root, h("h2", {}, "Submit a job"), form(recipes, doc, stored.items));
      }
    })
    .catch((err) => {
      if (!stop.signal.aborted) {
        fill(root, h("h2", {}, "Submit a job"), h("p", { class: "error" }, err.message));
      }
    });
  return () => stop.abort();
}

// Fields a script job does not have: it takes its own arguments.
const RECIPE_ONLY = new Set("epochs batch_size lr optimizer precision checkpoint_every".split(" "));
// Fields of the script fieldset, not the generic list.
const SCRIPT_FIELDS = new Set(["code", "entrypoint", "data", "requirements"]);

function form(recipes, doc, blobs) {
  const jobSchema = doc.components.schemas.JobCreate;
  const resolveRef = (ref) => doc.components.schemas[ref.split("/").pop()];
  const summary = h("p", { class: "muted", id: "recipe-summary" });
  const paramsBox = h("fieldset", { id: "params" });
  const errors = h("div", { class: "error", role: "alert", id: "submit-errors" });
  const button = h("button", { type: "submit", id: "submit-job" }, "Submit");

  // With no worker registered yet, the server accepts any recipe name and the job
  // waits; the params are then free JSON.
  const recipe = recipes.length
    ? h(
        "select",
        { name: "recipe", id: "field-recipe", required: true },
        recipes.map((r) => h("option", { value: r.name }, r.name)),
      )
    : h("input", { name: "recipe", id: "field-recipe", required: true });
  const byName = Object.fromEntries(recipes.map((r) => [r.name, r]));
  let params = [];
  const showParams = () => {
    const chosen = byName[recipe.value];
    fill(
      summary,
      chosen ? chosen.summary : "No worker has registered yet: the job will wait for one.",
    );
    const schema = chosen?.params_schema ?? { type: "object" };
    params = schema.properties
      ? Object.entries(schema.properties).map(([key, prop]) =>
          fieldFor(`params.${key}`, prop, resolveRef, (schema.required ?? []).includes(key)),
        )
      : [fieldFor("params", { type: "object", description: "JSON object" }, resolveRef)];
    fill(
      paramsBox,
      h("legend", {}, `Params of ${recipe.value || "the recipe"}`),
      params.map((f) => f.el),
    );
  };
  recipe.addEventListener(recipes.length ? "change" : "input", showParams);
  showParams();

  const jobFields = Object.entries(jobSchema.properties)
    .filter(([key]) => key !== "recipe" && key !== "params" && !SCRIPT_FIELDS.has(key))
    .map(([key, prop]) => fieldFor(key, prop, resolveRef));
  const script = scriptFields(blobs);
  const kind = h(
    "select",
    { id: "field-kind", name: "kind" },
    h("option", { value: "recipe" }, "a recipe"),
    h("option", { value: "script" }, "your own script, from an uploaded package"),
  );
  const recipeBox = h(
    "fieldset",
    { id: "recipe-box" },
    h("legend", {}, "Recipe"),
    h("div", { class: "field" }, h("label", { for: "field-recipe" }, "recipe"), recipe),
    summary,
  );
  const showKind = () => {
    const isScript = kind.value === "script";
    recipeBox.hidden = paramsBox.hidden = isScript;
    script.el.hidden = !isScript;
    for (const f of jobFields) f.el.hidden = isScript && RECIPE_ONLY.has(f.name);
  };
  kind.addEventListener("change", showKind);

  const el = h(
    "form",
    { id: "submit-form", class: "submit" },
    h("div", { class: "field" }, h("label", { for: "field-kind" }, "run"), kind),
    recipeBox,
    paramsBox,
    script.el,
    h(
      "fieldset",
      { id: "job-fields" },
      h("legend", {}, "Job"),
      jobFields.map((f) => f.el),
    ),
    errors,
    button,
  );

  showKind();

  el.addEventListener("submit", async (event) => {
    event.preventDefault();
    const isScript = kind.value === "script";
    const fields = isScript
      ? [...script.fields, ...jobFields.filter((f) => !RECIPE_ONLY.has(f.name))]
      : [...params, ...jobFields];
    for (const f of [...params, ...jobFields, ...script.fields]) f.setError("");
    fill(errors, "");
    let body;
    try {
      body = isScript ? {} : { recipe: recipe.value, params: {} };
      for (const f of fields) f.write(body);
    } catch (err) {
      fill(errors, err.message);
      return;
    }
    button.disabled = true;
    try {
      const job = await api.post("/jobs", body);
      location.hash = `#/jobs/${job.id}`;
    } catch (err) {
      showErrors(err, fields, errors);
    } finally {
      button.disabled = false;
    }
  });
  return el;
}

/**
 * The script's fields: the package (an uploaded blob), the command, data files and pip
 * requirements, each {name, el, write(body), setError(msg)} like the generated ones.
 */
function scriptFields(blobs) {
  const field = (name, label, input, help) => {
    const error = h("small", { class: "field-error" });
    const el = h(
      "div",
      { class: "field", "data-field": name },
      h("label", { for: input.id }, label),
      input,
      h("small", { class: "help" }, help),
      error,
    );
    return {
      name,
      el,
      input,
      setError(message) {
        error.textContent = message;
        el.classList.toggle("invalid", Boolean(message));
      },
    };
  };
  const describe = (b) =>
    `${b.digest.slice(7, 19)}… · ${num(b.size / 1024, 3)} KiB · ${when(b.created_at)}`;
  const code = field(
    "code",
    "package",
    h(
      "select",
      { id: "field-code" },
      blobs.map((b) => h("option", { value: b.digest }, describe(b))),
    ),
    blobs.length
      ? "A zip uploaded with trainyard submit --code, or PUT /api/v1/blobs in the API docs."
      : "Nothing uploaded yet: use trainyard submit --code DIR, or PUT /api/v1/blobs in /docs.",
  );
  code.write = (body) => {
    if (code.input.value) body.code = code.input.value;
  };
  const entrypoint = field(
    "entrypoint",
    "command",
    h("input", { id: "field-entrypoint", placeholder: "python train.py --epochs 3" }),
    "Run in the unpacked package; quote arguments that hold spaces.",
  );
  entrypoint.write = (body) => {
    const argv = splitCommand(entrypoint.input.value);
    if (argv.length) body.entrypoint = argv;
  };
  const data = field(
    "data",
    "data files",
    h("textarea", { id: "field-data", rows: 2, placeholder: "digits.npz=sha256:…" }),
    "One NAME=DIGEST a line: the blob is placed at $TRAINYARD_INPUT_DIR/NAME.",
  );
  data.write = (body) => {
    const lines = linesOf(data.input);
    if (!lines.length) return;
    body.data = {};
    for (const line of lines) {
      const at = line.indexOf("=");
      if (at < 1) throw new Error(`data: "${line}" is not NAME=DIGEST`);
      body.data[line.slice(0, at)] = line.slice(at + 1);
    }
  };
  const requirements = field(
    "requirements",
    "requirements",
    h("textarea", { id: "field-requirements", rows: 2, placeholder: "scikit-learn==1.9.1" }),
    "pip requirement lines; empty: the package's requirements.txt, if any.",
  );
  requirements.write = (body) => {
    const lines = linesOf(requirements.input);
    if (lines.length) body.requirements = lines;
  };
  const fields = [code, entrypoint, data, requirements];
  const el = h(
    "fieldset",
    { id: "script-box" },
    h("legend", {}, "Your script"),
    fields.map((f) => f.el),
  );
  return { el, fields };
}

/** A textarea's non-blank lines, trimmed. */
function linesOf(textarea) {
  return textarea.value
    .split("\n")
    .map((line) => line.trim())
    .filter(Boolean);
}

/** A command line to argv: whitespace separates, quotes group, backslash escapes. */
export function splitCommand(line) {
  const argv = [];
  let word = null;
  let quote = null;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote) {
      if (c === quote) quote = null;
      else if (c === "\\" && quote === '"' && i + 1 < line.length) word += line[++i];
      else word += c;
    } else if (c === '"' || c === "'") {
      quote = c;
      word ??= "";
    } else if (c === "\\" && i + 1 < line.length) {
      word = (word ?? "") + line[++i];
    } else if (/\s/.test(c)) {
      if (word !== null) argv.push(word);
      word = null;
    } else {
      word = (word ?? "") + c;
    }
  }
  if (quote) throw new Error("command: a quote is not closed");
  if (word !== null) argv.push(word);
  return argv;
}

/** A 422's errors next to their fields, and all of them in the summary above the button. */
function showErrors(err, fields, summary) {
  const list = Array.isArray(err.detail) ? err.detail : null;
  if (!list) {
    fill(summary, err.message);
    return;
  }
  fill(
    summary,
    h("p", {}, `The server refused the job (HTTP ${err.status}):`),
    h(
      "ul",
      {},
      list.map((e) => h("li", {}, h("code", {}, fieldOf(e)), ` ${e.msg}`)),
    ),
  );
  for (const e of list) {
    const name = fieldOf(e);
    // An error inside a params value ("params.layers.0") belongs to its field.
    fields.find((f) => name === f.name || name.startsWith(`${f.name}.`))?.setError(e.msg);
  }
}
