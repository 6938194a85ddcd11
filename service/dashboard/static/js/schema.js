// One form field from one JSON Schema property (the subset pydantic emits: $ref to an
// enum, anyOf [X, null], integer/number bounds, boolean, string, and free objects).

import { h } from "./dom.js";

/** Inline a $ref and unwrap anyOf [X, {type: null}]; the outer keywords win. */
export function normalize(prop, resolveRef) {
  let { $ref, anyOf, allOf, ...outer } = prop;
  if (allOf?.length === 1) $ref ??= allOf[0].$ref;
  if ($ref) return normalize({ ...resolveRef($ref), ...outer }, resolveRef);
  if (anyOf) {
    const some = anyOf.filter((o) => o.type !== "null");
    if (some.length === 1) {
      return { ...normalize(some[0], resolveRef), ...outer, nullable: some.length < anyOf.length };
    }
    return { ...outer, type: "json" }; // a real union: let people type JSON
  }
  return prop;
}

/**
 * A field for `name` ("epochs", or "params.hidden" for a recipe param): returns
 * {name, el, write(body), setError(msg)}. write() puts the value into the request
 * body, or nothing when left empty, so the server's default applies.
 */
export function fieldFor(name, prop, resolveRef, required = false) {
  const schema = normalize(prop, resolveRef);
  const id = `field-${name.replaceAll(".", "-")}`;
  const { input, read } = widget(schema, { id, name, required });
  const error = h("small", { class: "field-error" });
  const help = [schema.description, bounds(schema)].filter(Boolean).join(" · ");
  const el = h(
    "div",
    { class: "field", "data-field": name },
    h("label", { for: id }, name.split(".").pop()),
    input,
    help ? h("small", { class: "help" }, help) : null,
    error,
  );
  return {
    name,
    el,
    write(body) {
      const value = read();
      if (value === undefined) return;
      const path = name.split(".");
      const last = path.pop();
      let target = body;
      for (const part of path) target = target[part] ??= {};
      target[last] = value;
    },
    setError(message) {
      error.textContent = message;
      el.classList.toggle("invalid", Boolean(message));
    },
  };
}

function widget(schema, attrs) {
  const initial = schema.default ?? "";
  if (schema.enum) {
    const blank = schema.nullable || schema.default === undefined;
    const input = h(
      "select",
      attrs,
      blank ? h("option", { value: "" }, "–") : null,
      schema.enum.map((v) => h("option", { value: v, selected: v === schema.default }, String(v))),
    );
    return { input, read: () => input.value || undefined };
  }
  if (schema.type === "boolean") {
    const input = h("input", { ...attrs, type: "checkbox", checked: schema.default === true });
    return { input, read: () => input.checked };
  }
  if (schema.type === "integer" || schema.type === "number") {
    const input = h("input", {
      ...attrs,
      type: "number",
      value: initial,
      min: schema.minimum,
      max: schema.maximum,
      step: schema.type === "integer" ? 1 : "any",
    });
    return { input, read: () => (input.value === "" ? undefined : Number(input.value)) };
  }
  if (schema.type === "string") {
    const input = h("input", {
      ...attrs,
      type: "text",
      value: initial,
      maxlength: schema.maxLength,
    });
    return { input, read: () => input.value || undefined };
  }
  const input = h("textarea", { ...attrs, rows: 2, placeholder: "JSON" });
  if (schema.default !== undefined) input.value = JSON.stringify(schema.default);
  const read = () => {
    if (!input.value.trim()) return undefined;
    try {
      return JSON.parse(input.value);
    } catch {
      throw new Error(`${attrs.name}: not valid JSON`);
    }
  };
  return { input, read };
}

/** "≥ 1, ≤ 1024" or "> 0": the limits the server will check. */
function bounds(schema) {
  const low = limit(schema.exclusiveMinimum, ">") ?? limit(schema.minimum, "≥");
  const high = limit(schema.exclusiveMaximum, "<") ?? limit(schema.maximum, "≤");
  return [low, high].filter(Boolean).join(", ");
}

function limit(value, sign) {
  return value === undefined ? null : `${sign} ${value}`;
}
