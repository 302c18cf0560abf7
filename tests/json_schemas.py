"""Fifty JSON Schemas across what response_format must take (objects, arrays, enums, required and optional
properties, string/number/integer/boolean/null, nesting, anyOf, $ref within the schema), each with a
prompt that asks for it, one valid instance and one invalid one (for the grammar engines' token checks).
Deterministic: schema i comes from random.Random(i).

Strings carry maxLength and integers/numbers a range, arrays maxItems: a constrained small model then
always reaches the end of its reply within a token budget (a bare integer lets a 135M model write "1111…"
until max_tokens, which is the model's choice, not the grammar's). `token_budget` is that budget: the
length of the longest instance, each token writing at least one character.
"""

from __future__ import annotations

import json
import random

N_SCHEMAS = 50
FEATURES = ("object", "array", "enum", "required", "optional", "string", "number", "integer", "boolean", "null",
            "nesting", "anyOf", "$ref")

NAMES = ["name", "city", "title", "color", "country", "author", "food", "animal", "language", "planet"]
WORDS = ["red", "green", "blue", "small", "large", "north", "south", "cat", "dog", "tea"]
NUMBERS = ["age", "year", "count", "rating", "price", "score", "height", "pages"]
FLAGS = ["active", "done", "public", "verified"]
TOPICS = ["a person", "a book", "a city", "a pet", "a planet", "a recipe", "a film", "a car"]


def _leaf(rng: random.Random, used: set[str], features: set[str]) -> tuple[str, dict, object, object]:
    """(key, schema, a valid value, an invalid value) for one property."""
    kind = rng.choice(["string", "string", "integer", "number", "boolean", "enum", "null", "anyOf"])
    pool = {"string": NAMES, "enum": NAMES, "integer": NUMBERS, "number": NUMBERS, "boolean": FLAGS,
            "null": ["note", "extra"], "anyOf": ["value", "id", "code"]}[kind]
    key = next((k for k in rng.sample(pool, len(pool)) if k not in used), f"{pool[0]}_{len(used)}")
    used.add(key)
    features.add(kind if kind != "null" else "null")
    if kind == "string":
        n = rng.randint(8, 24)
        return key, {"type": "string", "maxLength": n}, "x" * rng.randint(1, n), 5
    if kind == "enum":
        options = rng.sample(WORDS, rng.randint(2, 4))
        return key, {"type": "string", "enum": options}, options[0], "zzz"
    if kind == "integer":
        return key, {"type": "integer", "minimum": 0, "maximum": 9999}, rng.randint(0, 9999), "7"
    if kind == "number":
        return key, {"type": "number", "minimum": 0, "maximum": 1000}, round(rng.uniform(0, 1000), 2), True
    if kind == "boolean":
        return key, {"type": "boolean"}, rng.random() < 0.5, "yes"
    if kind == "null":
        return key, {"type": "null"}, None, 0
    return key, {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999}, {"type": "string", "maxLength": 12}]}, rng.choice([42, "A7"]), [1]


def _object(rng: random.Random, depth: int, features: set[str], defs: dict) -> tuple[dict, dict, dict]:
    used: set[str] = set()
    props, valid, bads, required = {}, {}, {}, []
    for _ in range(rng.randint(1, 3) if depth else rng.randint(2, 4)):
        roll = rng.random()
        if roll < 0.15 and depth < 2:
            key = next((k for k in rng.sample(["details", "owner", "place", "meta"], 4) if k not in used), f"part_{len(used)}")
            used.add(key)
            sub, v, bad = _object(rng, depth + 1, features, defs)
            features.add("nesting")
        elif roll < 0.3:
            key, item, v1, bad1 = _leaf(rng, used, features)
            key = key + "s" if key + "s" not in used else key + "_list"
            used.add(key)
            sub = {"type": "array", "items": item, "minItems": 1, "maxItems": 3}
            v, bad = [v1], [bad1]
            features.add("array")
        elif roll < 0.4:
            name = f"thing{len(defs)}"
            key, item, v, bad = _leaf(rng, used, features)
            defs[name] = item
            sub = {"$ref": f"#/$defs/{name}"}
            features.add("$ref")
        else:
            key, sub, v, bad = _leaf(rng, used, features)
        props[key], valid[key], bads[key] = sub, v, bad
        if rng.random() < 0.75 or not required:
            required.append(key)
        else:
            features.add("optional")
    wrong = rng.choice(required)
    invalid = {**valid, wrong: bads[wrong]}
    features.update({"object", "required"})
    return {"type": "object", "properties": props, "required": required}, valid, invalid


def schema_case(i: int) -> dict:
    """{schema, prompt, valid, invalid, features} for schema i."""
    rng = random.Random(i)
    features: set[str] = set()
    defs: dict = {}
    schema, valid, invalid = _object(rng, 0, features, defs)
    if i % 10 == 9:              # a top-level array of objects now and then
        schema = {"type": "array", "items": schema, "minItems": 1, "maxItems": 2}
        valid, invalid = [valid], [invalid]
        features.add("array")
    if defs:
        schema["$defs"] = defs
    topic = TOPICS[i % len(TOPICS)]
    prompt = f"Describe {topic} as JSON with the fields {', '.join(_keys(schema))}."
    return {"schema": schema, "prompt": prompt, "valid": valid, "invalid": invalid, "features": features}


def _keys(schema: dict) -> list[str]:
    node = schema["items"] if schema.get("type") == "array" else schema
    return list(node["properties"])


def cases(n: int = N_SCHEMAS) -> list[dict]:
    return [schema_case(i) for i in range(n)]


def compact(value) -> str:
    """JSON as the constrained reply writes it (", " and ": ", nothing else)."""
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


def response_format(case: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": case["schema"], "strict": True}}


# A number's digits are not bounded by its range (0.1234567…): the budget allows this many characters.
NUMBER_CHARS = 24
BUDGET_SLACK = 8       # the end-of-reply token and a little room


def _longest(schema: dict, defs: dict) -> object:
    """A valid instance at least as long, written compactly, as any the schema takes (strings twice their
    maxLength: each character may come escaped)."""
    if "$ref" in schema:
        return _longest(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in schema:
        return max((_longest(s, defs) for s in schema["anyOf"]), key=lambda v: len(compact(v)))
    if "enum" in schema:
        return max(schema["enum"], key=lambda v: len(compact(v)))
    kind = schema.get("type")
    if kind == "object":
        return {k: _longest(v, defs) for k, v in schema["properties"].items()}
    if kind == "array":
        return [_longest(schema["items"], defs)] * schema["maxItems"]
    if kind == "string":
        return "x" * (2 * schema["maxLength"])
    if kind == "integer":
        return -schema["maximum"]
    if kind == "number":
        return "9" * NUMBER_CHARS          # (as wide as such a number may be written)
    if kind == "boolean":
        return False
    return None


def token_budget(case: dict) -> int:
    """max_tokens that a reply to `case` always fits in (see the module docstring)."""
    schema = case["schema"]
    return len(compact(_longest(schema, schema.get("$defs", {})))) + BUDGET_SLACK
