// Request shapes, defined once in Python (pyshim/serve/protocol.py) and written by `pyshim setup` to
// vendor/definitions.js: the OpenAI-shaped requests of the JS API and the /v1 endpoint, and the messages
// the page posts to the engine Worker. This is the JS twin of Python's validator — the same JSON Schema
// subset (type, enum, const, minimum, maximum, exclusiveMinimum, minLength, minItems, maxItems, items,
// properties, required, anyOf, default), the same error messages ("`temperature` must be a number in
// [0, 2], got 3"), null taking the default as an absent field does — so a bad request is refused here,
// before it is posted, by exactly the rules Python applies again on arrival (a test runs both on the
// same requests). No library: ajv would need a bundler, and the subset is fifty lines.

import { DEFINITIONS, SCHEMAS } from "../vendor/definitions.js";

export { DEFINITIONS, SCHEMAS };

export class ProtocolError extends Error {
  constructor(message, param) {
    super(message);
    this.name = "BadRequestError";
    this.param = param;
  }
}

const TYPES = {
  string: (v) => typeof v === "string",
  number: (v) => typeof v === "number" && Number.isFinite(v),
  integer: (v) => Number.isInteger(v),
  boolean: (v) => typeof v === "boolean",
  array: (v) => Array.isArray(v),
  object: (v) => v !== null && typeof v === "object" && !Array.isArray(v),
  null: (v) => v === null,
};

const typesOf = (node) => (node.type === undefined ? [] : Array.isArray(node.type) ? node.type : [node.type]);
const given = (obj, key, sub) => key in obj && obj[key] !== undefined && !(obj[key] === null && "default" in sub);
const join = (path, key) => (path ? `${path}.${key}` : key);

// The value as Python's messages show it: JSON, as JSON.stringify writes it.
export const show = (value) => (value === undefined ? "undefined" : JSON.stringify(value));

function matches(node, value) {
  if (node.anyOf) return node.anyOf.some((option) => matches(option, value));
  if (node.enum && !node.enum.includes(value)) return false;
  const types = typesOf(node);
  if ("const" in node && value !== node.const && !(value === null && types.includes("null"))) return false;
  if (types.length && !types.some((t) => TYPES[t](value))) return false;
  if (TYPES.number(value)) {
    if ("minimum" in node && value < node.minimum) return false;
    if ("maximum" in node && value > node.maximum) return false;
    if ("exclusiveMinimum" in node && value <= node.exclusiveMinimum) return false;
  }
  if (typeof value === "string" || Array.isArray(value)) {
    if (value.length < (node.minLength ?? node.minItems ?? 0)) return false;
    if (Array.isArray(value) && value.length > (node.maxItems ?? value.length)) return false;
  }
  if (Array.isArray(value) && node.items) return value.every((v) => matches(node.items, v));
  if (TYPES.object(value) && node.properties) {
    if ((node.required ?? []).some((key) => !(key in value))) return false;
    return Object.entries(node.properties).every(([key, sub]) => !given(value, key, sub) || matches(sub, value[key]));
  }
  return true;
}

// [path, description] of the innermost described node `value` fails, or null when it matches.
function find(node, value, path) {
  if (matches(node, value)) return null;
  if (TYPES.object(value) && node.properties) {
    for (const key of node.required ?? []) {
      const sub = node.properties[key];
      if (!(key in value) && sub.description) return [join(path, key), sub.description];
    }
    for (const [key, sub] of Object.entries(node.properties)) {
      if (given(value, key, sub) && sub.description) {
        const inner = find(sub, value[key], join(path, key));
        if (inner) return inner;
      }
    }
  }
  if (Array.isArray(value) && node.items?.description) {
    const { items, ...outer } = node;
    if (matches(outer, value)) {
      for (let i = 0; i < value.length; i++) {
        const inner = find(items, value[i], `${path}[${i}]`);
        if (inner) return inner;
      }
    }
  }
  return [path, node.description ?? "valid"];
}

function lookup(body, path) {
  let value = body;
  for (const part of path.replaceAll("]", "").replaceAll("[", ".").split(".")) {
    if (!part) continue;
    if (value === null || typeof value !== "object" || !(part in value)) return undefined;
    value = value[part];
  }
  return value;
}

function withDefaults(node, value) {
  if (!TYPES.object(value) || !node.properties) return value;
  const out = { ...value };
  for (const [key, sub] of Object.entries(node.properties)) {
    if (out[key] !== undefined && out[key] !== null) out[key] = withDefaults(sub, out[key]);
    else if ("default" in sub) out[key] = sub.default;
    else if (out[key] === undefined && sub.type === "object" && sub.properties) out[key] = withDefaults(sub, {});
  }
  return out;
}

// `body` checked against SCHEMAS[kind]: a copy with the defaults filled in, or a ProtocolError naming the
// field (`param`) and what it must be.
export function validate(kind, body) {
  const schema = SCHEMAS[kind];
  if (!schema) throw new ProtocolError(`unknown request kind ${kind}`, null);
  if (!TYPES.object(body)) throw new ProtocolError(`the request must be a JSON object, got ${show(body)}`, null);
  const bad = find(schema, body, "");
  if (bad) {
    const [path, description] = bad;
    const value = lookup(body, path);
    if (value === undefined) throw new ProtocolError(`\`${path}\` is required: ${description}`, path);
    throw new ProtocolError(`\`${path}\` must be ${description}, got ${show(value)}`, path);
  }
  return withDefaults(schema, body);
}
