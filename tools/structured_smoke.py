#!/usr/bin/env python3
"""Structured outputs with the official `openai` client against a running `deltaq serve`.

    deltaq serve --port 8080 &
    python3 tools/structured_smoke.py --base-url http://127.0.0.1:8080/v1

Twenty `response_format: json_schema` requests (nested objects, arrays, enums, numbers with ranges,
required fields), each answer parsed and validated against its schema with `jsonschema`; GBNF
grammars through `extra_body={"grammar": ...}`, each answer checked with an equivalent regular
expression; a `json_object` request; llama.cpp's `json_schema` field on /v1/completions; a strict tool
(`tool_choice: "required"`) whose call arguments are validated against its parameters; and the 400s
for an unsupported schema and a broken grammar. The demo model never saw JSON: whatever it writes
is the constraint's doing. Exits non-zero on the first failed check.
"""

import argparse
import json
import re
import sys

import jsonschema
import openai

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}

# Strings are bounded (maxLength, enums, patterns): a model that never saw JSON would not close an
# unbounded string within max_tokens.
NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SCHEMAS = [
    {"type": "object", "properties": {"name": NAME}, "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
     "required": ["color"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "count": {"type": "integer", "minimum": 1, "maximum": 9}},
     "required": ["ok", "count"], "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["score"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                               "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"person": {"type": "object", "properties": {"name": NAME,
                                                                                   "age": {"type": "integer", "minimum": 18, "maximum": 99}},
                                                 "required": ["name", "age"], "additionalProperties": False}},
     "required": ["person"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"book": {"enum": ["Genesis", "Exodus", "Psalms"]},
                                      "chapter": {"type": "integer", "minimum": 1, "maximum": 150},
                                      "verse": {"type": "integer", "minimum": 1, "maximum": 176}},
     "required": ["book", "chapter", "verse"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "array", "items": {"type": "number", "minimum": -10, "maximum": 10},
                                                "minItems": 2, "maxItems": 2}},
     "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"const": "done"}, "code": {"type": "integer", "enum": [200, 404, 500]}},
     "required": ["status", "code"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99}, "label": NAME},
        "required": ["id", "label"], "additionalProperties": False}}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
     "required": ["zip"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["c"], "additionalProperties": False}},
        "required": ["b"], "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10}, {"type": "null"}]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"temperature": {"type": "number", "exclusiveMinimum": -50, "exclusiveMaximum": 50},
                                      "unit": {"enum": ["C", "F"]}},
     "required": ["temperature", "unit"], "additionalProperties": False},
    {"type": "object", "properties": {"title": NAME, "note": {"type": "string", "maxLength": 6}},
     "required": ["title"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
        "type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
     "required": ["matrix"], "additionalProperties": False},
    {"$defs": {"who": {"type": "object", "properties": {"name": NAME}, "required": ["name"], "additionalProperties": False}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/who"}, "to": {"$ref": "#/$defs/who"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"type": "object", "properties": {"flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4},
                                      "ratio": {"type": "number", "minimum": 0.5, "maximum": 2.5}},
     "required": ["flags", "ratio"], "additionalProperties": False},
]

# (GBNF, an equivalent regular expression for the whole answer)
GRAMMARS = [
    ('root ::= "yes" | "no"', r"(yes|no)"),
    ('root ::= [0-9]{3} "-" [0-9]{4}', r"[0-9]{3}-[0-9]{4}"),
    ('root ::= "[" item ("," item){0,4} "]"\nitem ::= [a-z]{1,8}', r"\[[a-z]{1,8}(,[a-z]{1,8}){0,4}\]"),
    ('# sums\nroot ::= term (("+" | "-") term){0,3}\nterm ::= [1-9] [0-9]{0,2}',
     r"[1-9][0-9]{0,2}([+-][1-9][0-9]{0,2}){0,3}"),
    ('root ::= year "-" month "-" day\n'
     'year ::= "19" [0-9] [0-9] | "20" [0-2] [0-9]\n'
     'month ::= "0" [1-9] | "1" [0-2]\n'
     'day ::= "0" [1-9] | [12] [0-9] | "3" [01]',
     r"(19[0-9]{2}|20[0-2][0-9])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"),
    ('root ::= "\\"" [^"\\\\\\n]{1,20} "\\""', r'"[^"\\\n]{1,20}"'),
    ('root ::= "And " name " said, " word (" " word){0,4} "."\n'
     'name ::= "Moses" | "Aaron" | "David"\nword ::= [a-z]{1,7}',
     r"And (Moses|Aaron|David) said, [a-z]{1,7}( [a-z]{1,7}){0,4}\."),
]


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def error_body(e):
    body = e.body if isinstance(e.body, dict) else {}
    return body.get("error", body)


def chat(client, model, prompt, max_tokens, **extra):
    r = client.chat.completions.create(model=model, max_tokens=max_tokens, seed=1,
                                       messages=[{"role": "user", "content": prompt}], **extra)
    return r.choices[0].message.content or "", r.choices[0].finish_reason


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--max-tokens", type=int, default=400)
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=300)
    model = client.models.list().data[0].id

    valid = 0
    for i, schema in enumerate(SCHEMAS):
        rf = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        text, finish = chat(client, model, "Answer in JSON.", a.max_tokens, response_format=rf,
                            extra_body=NO_THINK)
        try:
            jsonschema.validate(json.loads(text), schema)
            ok = finish == "stop"
        except (ValueError, jsonschema.ValidationError) as e:
            print(f"  schema {i}: {e}", file=sys.stderr)
            ok = False
        valid += ok
        print(f"  schema {i:2}: finish={finish} {text[:100]!r}")
    check(valid == len(SCHEMAS), f"json_schema: {valid}/{len(SCHEMAS)} answers complete and valid")

    matched = 0
    for i, (gbnf, rx) in enumerate(GRAMMARS):
        text, finish = chat(client, model, "Say something.", a.max_tokens,
                            extra_body={"grammar": gbnf, **NO_THINK})
        ok = finish == "stop" and re.fullmatch(rx, text) is not None
        matched += ok
        print(f"  grammar {i}: finish={finish} {text[:100]!r}")
    check(matched == len(GRAMMARS), f"grammar: {matched}/{len(GRAMMARS)} answers in the language")

    text, finish = chat(client, model, "Answer in JSON.", 200, response_format={"type": "json_object"},
                        extra_body=NO_THINK)
    print(f"  json_object: finish={finish} {text[:100]!r}")
    if finish == "stop":
        check(isinstance(json.loads(text), dict), "json_object: a JSON object")
    else:
        # Any object may nest without end: a cut answer must still be a prefix the schema allows.
        check(text.startswith("{"), "json_object cut at max_tokens: starts as an object")

    schema = SCHEMAS[8]
    r = client.completions.create(model=model, prompt="In the beginning", max_tokens=a.max_tokens, seed=1,
                                  extra_body={"json_schema": schema})
    doc = json.loads(r.choices[0].text)
    jsonschema.validate(doc, schema)
    check(r.choices[0].finish_reason == "stop", f"completions with json_schema: {doc}")

    params = SCHEMAS[8]
    r = client.chat.completions.create(
        model=model, max_tokens=a.max_tokens, seed=1, messages=[{"role": "user", "content": "Find the verse."}],
        tools=[{"type": "function", "function": {"name": "find_verse", "strict": True, "parameters": params}}],
        tool_choice="required", extra_body=NO_THINK)
    calls = r.choices[0].message.tool_calls or []
    check(r.choices[0].finish_reason == "tool_calls" and len(calls) > 0, f"strict tool: {len(calls)} call(s)")
    for c in calls:
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, params)
        check(c.function.name == "find_verse", f"strict tool call arguments valid: {args}")

    try:
        chat(client, model, "x", 8, response_format={"type": "json_schema", "json_schema": {
            "name": "bad", "schema": {"type": "object", "properties": {"x": {"type": "array", "uniqueItems": True}}}}})
        check(False, "an unsupported schema keyword is refused")
    except openai.BadRequestError as e:
        body = error_body(e)
        check(body.get("param") == "response_format" and "uniqueItems" in body.get("message", ""),
              f"unsupported schema keyword -> 400 naming it: {body.get('message', '')[:120]}")
    try:
        chat(client, model, "x", 8, extra_body={"grammar": 'root ::= "a" undefined-rule'})
        check(False, "a broken grammar is refused")
    except openai.BadRequestError as e:
        body = error_body(e)
        check(body.get("param") == "grammar" and "undefined-rule" in body.get("message", ""),
              f"broken grammar -> 400: {body.get('message', '')[:120]}")


if __name__ == "__main__":
    main()
