#!/usr/bin/env python3
"""Drives a running `deltaq serve` with the official `ollama` Python client: list, show, ps, chat and
generate (streaming and not, thinking on and off), tools, format with a JSON schema, and errors.

    deltaq serve --port 8080 &
    python3 tools/ollama_smoke.py --host http://127.0.0.1:8080

With `--image FILE.png` the server must take images (`deltaq serve --mmproj ...`); without it, an image
must be refused with a 400. `--skip-format` leaves out the check that a `format` JSON schema is followed (it needs constrained
sampling in the engine). The demo model writes Bible-like text: the checks are on the shape of the
answers, not their content. Exits non-zero on the first failed check.
"""

import argparse
import json
import sys

import ollama


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def final_ok(r, max_eval):
    return (r.done and r.done_reason in ("stop", "length") and 1 <= (r.eval_count or 0) <= max_eval
            and (r.prompt_eval_count or 0) >= 1 and (r.total_duration or 0) > 0
            and (r.eval_duration or 0) > 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="http://127.0.0.1:8080")
    ap.add_argument("--image", help="a PNG to send in a chat message (the server runs with --mmproj)")
    ap.add_argument("--skip-format", action="store_true",
                    help="do not check that a format schema is followed (no constrained sampling)")
    a = ap.parse_args()
    client = ollama.Client(host=a.host, timeout=120)

    models = client.list().models
    check(len(models) == 1 and models[0].details.format == "gguf", f"list -> {models[0].model}")
    model = models[0].model
    d = models[0].details
    check(d.family == "qwen35" and d.parameter_size and d.quantization_level,
          f"details: {d.family} {d.parameter_size} {d.quantization_level}")

    s = client.show(model)
    check("completion" in s.capabilities and "thinking" in s.capabilities,
          f"show: capabilities {s.capabilities}")
    check(s.modelinfo.get("general.architecture") == "qwen35" and s.template, "show: model_info, template")
    check(len(client.ps().models) == 1, "ps")

    msgs = [{"role": "system", "content": "You are a scribe."}, {"role": "user", "content": "Who was Moses?"}]
    r = client.chat(model=model, messages=msgs, think=False, options={"num_predict": 24, "ignore_eos": True})
    check(r.message.role == "assistant" and isinstance(r.message.content, str), "chat (non-streaming)")
    check("<think>" not in r.message.content and not r.message.thinking, "think=False: no thinking")
    check(final_ok(r, 24), f"chat counters: {r.prompt_eval_count}+{r.eval_count}, {r.done_reason}")

    # ignore_eos (the llama.cpp extension deltaq takes): the demo model may end at once when thinking.
    r = client.chat(model=model, messages=msgs, think=True, options={"num_predict": 24, "ignore_eos": True})
    check(bool(r.message.thinking) and "<think>" not in (r.message.thinking + r.message.content),
          "think=True: message.thinking apart from the content")

    parts = list(client.chat(model=model, messages=msgs, stream=True, think=True,
                             options={"num_predict": 16, "temperature": 0, "ignore_eos": True}))
    check(len(parts) > 2 and all(not p.done for p in parts[:-1]) and final_ok(parts[-1], 16),
          f"chat streaming: {len(parts)} pieces")
    check(bool("".join((p.message.thinking or "") + p.message.content for p in parts)),
          "chat streaming: text")

    g = client.generate(model=model, prompt="Who was Noah?", think=False,
                        options={"num_predict": 16, "temperature": 0, "ignore_eos": True})
    check(isinstance(g.response, str) and g.response and final_ok(g, 16), "generate (non-streaming)")
    streamed = "".join(p.response for p in client.generate(
        model=model, prompt="Who was Noah?", think=False, stream=True,
        options={"num_predict": 16, "temperature": 0, "ignore_eos": True}))
    check(streamed == g.response, "generate streaming gives the same greedy text")
    g = client.generate(model=model, prompt="Who was Noah?", think=True,
                        options={"num_predict": 16, "ignore_eos": True})
    check(bool(g.thinking), "generate think=True: thinking")
    g = client.generate(model=model, prompt="In the beginning", raw=True, options={"num_predict": 8, "ignore_eos": True})
    check(final_ok(g, 8), "generate raw")

    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
          city: The city's name
        """
        return "Sunny"

    history = msgs + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Hebron"}}}]},
        {"role": "tool", "content": "Sunny", "tool_name": "get_weather"},
    ]
    r = client.chat(model=model, messages=history, tools=[get_weather], think=False,
                    options={"num_predict": 12, "ignore_eos": True})
    calls = r.message.tool_calls or []
    check(final_ok(r, 12) and all(isinstance(c.function.arguments, dict) for c in calls),
          f"tools round trip ({len(calls)} calls)")

    # Bounded strings and numbers: the KJV model never saw JSON, so an unbounded string could run past
    # num_predict and be cut (done_reason "length"), which no constraint prevents.
    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 24},
                             "age": {"type": "integer", "minimum": 0, "maximum": 999}},
              "required": ["name", "age"]}
    r = client.chat(model=model, messages=[{"role": "user", "content": "Moses as JSON"}], format=schema,
                    think=False, options={"num_predict": 256, "temperature": 0})
    check(r.done and (a.skip_format or r.done_reason == "stop"),
          f"format with a JSON schema accepted (done_reason {r.done_reason})")
    if not a.skip_format:
        import jsonschema
        try:
            jsonschema.validate(json.loads(r.message.content), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            check(False, f"format: the answer follows the schema ({e}): {r.message.content!r}")
        check(True, "format: the answer follows the schema")

    try:
        client.chat(model="no-such-model", messages=msgs)
        check(False, "unknown model refused")
    except ollama.ResponseError as e:
        check(e.status_code == 404 and "not found" in e.error, f"unknown model -> {e.status_code} {e.error}")
    try:
        client.chat(model=model, messages=msgs, options={"temperature": 9})
        check(False, "bad option refused")
    except ollama.ResponseError as e:
        check(e.status_code == 400, f"bad option -> {e.status_code} {e.error}")
    if a.image:
        check("vision" in s.capabilities, "show: vision capability with --mmproj")
        r = client.chat(model=model, messages=[{"role": "user", "content": "What is this?", "images": [a.image]}],
                        think=False, options={"num_predict": 8, "ignore_eos": True})
        check(final_ok(r, 8) and r.prompt_eval_count > 20, f"chat with an image: {r.prompt_eval_count} prompt tokens")
    try:
        client.chat(model=model, messages=[{"role": "user", "content": "x", "images": [b"not an image"]}])
        check(False, "image refused")
    except ollama.ResponseError as e:
        check(e.status_code == 400, f"image without --mmproj or not an image -> {e.status_code} {e.error}")
    print("ollama smoke test passed")


if __name__ == "__main__":
    main()
