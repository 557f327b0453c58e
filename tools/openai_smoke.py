#!/usr/bin/env python3
"""Drives a running `deltaq serve` with the official `openai` client: chat completions (streaming and
not, thinking on and off), text completions (streaming and not), the model list and error handling.

    deltaq serve --port 8080 &
    python3 tools/openai_smoke.py --base-url http://127.0.0.1:8080/v1

Exits non-zero on the first failed check.
"""

import argparse
import sys

import openai


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="none")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=120)

    models = client.models.list()
    model = models.data[0].id
    check(len(models.data) == 1, f"models.list -> {model}")

    msgs = [
        {"role": "system", "content": "You are a scribe."},
        {"role": "user", "content": "Who was Moses?"},
    ]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=24,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    m = r.choices[0].message
    check(r.object == "chat.completion" and m.role == "assistant", "chat.completions (non-streaming)")
    check("<think>" not in (m.content or "") and "</think>" not in (m.content or ""),
          "enable_thinking=false: no think block in the content")
    check(getattr(m, "reasoning_content", None) is None, "enable_thinking=false: no reasoning_content")
    check(r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
          f"usage {r.usage.prompt_tokens}+{r.usage.completion_tokens}")
    check(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason {r.choices[0].finish_reason}")

    stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    content, reasoning, finish, usage, n = "", "", None, None, 0
    for chunk in stream:
        n += 1
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        reasoning += getattr(d, "reasoning_content", None) or ""
        finish = chunk.choices[0].finish_reason or finish
    check(n > 2 and finish == "length", f"chat.completions streaming: {n} chunks, finish_reason {finish}")
    check(usage is not None and usage.completion_tokens == 24, "streaming usage (include_usage)")
    check("<think>" not in content + reasoning, "thinking on: reasoning kept out of the tags")

    r = client.completions.create(model=model, prompt="In the beginning", max_tokens=16, temperature=0)
    text = r.choices[0].text
    check(r.object == "text_completion" and len(text) > 0, f"completions: {text!r}")
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="In the beginning", max_tokens=16, temperature=0, stream=True) if c.choices)
    check(streamed == text, "completions streaming gives the same greedy text")

    try:
        client.chat.completions.create(model="no-such-model", messages=msgs)
        check(False, "unknown model is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "unknown model -> 404 NotFoundError")
    try:
        client.chat.completions.create(model=model, messages=msgs, temperature="hot")
        check(False, "a wrong type is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "temperature" in str(e), "wrong type -> 400 BadRequestError")
    print("openai smoke: all checks passed")


if __name__ == "__main__":
    main()
