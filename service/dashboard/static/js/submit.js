// The submit form, generated from the schemas the server publishes: each recipe's
// params JSON Schema (GET /api/v1/recipes) and the JobCreate schema (/openapi.json).
// Validation is the server's: a 422 is shown next to the fields it names.

import { api, fieldOf, openapi } from "./api.js";
import { fill, h } from "./dom.js";
import { fieldFor } from "./schema.js";

export function submitView(root) {
  const stop = new AbortController();
  fill(root, h("h2", {}, "Submit a job"), h("p", { class: "muted" }, "Loading the schemas…"));
  Promise.all([api.get("/recipes", { signal: stop.signal }), openapi()])
    .then(([recipes, doc]) => {
      if (!stop.signal.aborted) fill(root, h("h2", {}, "Submit a job"), form(recipes, doc));
    })
    .catch((err) => {
      if (!stop.signal.aborted) {
        fill(root, h("h2", {}, "Submit a job"), h("p", { class: "error" }, err.message));
      }
    });
  return () => stop.abort();
}

function form(recipes, doc) {
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
    .filter(([key]) => key !== "recipe" && key !== "params")
    .map(([key, prop]) => fieldFor(key, prop, resolveRef));

  const el = h(
    "form",
    { id: "submit-form", class: "submit" },
    h(
      "fieldset",
      {},
      h("legend", {}, "Recipe"),
      h("div", { class: "field" }, h("label", { for: "field-recipe" }, "recipe"), recipe),
      summary,
    ),
    paramsBox,
    h(
      "fieldset",
      { id: "job-fields" },
      h("legend", {}, "Job"),
      jobFields.map((f) => f.el),
    ),
    errors,
    button,
  );

  el.addEventListener("submit", async (event) => {
    event.preventDefault();
    const fields = [...params, ...jobFields];
    for (const f of fields) f.setError("");
    fill(errors, "");
    let body;
    try {
      body = { recipe: recipe.value, params: {} };
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
