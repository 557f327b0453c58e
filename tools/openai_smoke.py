#!/usr/bin/env python3
"""Drives a running `deltaq serve` with the official `openai` client: chat completions (streaming and
not, thinking on and off), text completions (streaming and not), the model list and error handling.

    deltaq serve --port 8080 &
    python3 tools/openai_smoke.py --base-url http://127.0.0.1:8080/v1

With `--image FILE.png` the server must take images (`deltaq serve --mmproj ...`): an image content part
is sent as a data URL and must be answered. Without it, an image part must be refused with a 400 (the
demo model has no vision tower).

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
    ap.add_argument("--image", help="a PNG to send as an image part (the server runs with --mmproj)")
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
    check_image(client, model, a.image)
    print("openai smoke: all checks passed")


def check_image(client, model, path):
    """An image content part: answered by a server with --mmproj, a 400 otherwise."""
    import base64

    if path:
        with open(path, "rb") as f:
            data = f.read()
    else:
        data = b"not sent to a vision tower"
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    msgs = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "Describe."},
    ]}]
    if path:
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        check(r.choices[0].message.role == "assistant" and r.usage.prompt_tokens > 64,
              f"image part answered ({r.usage.prompt_tokens} prompt tokens)")
        try:
            bad = [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]
            client.chat.completions.create(model=model, messages=bad, max_tokens=8)
            check(False, "a remote image URL is refused")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and "remote" in str(e), "remote image URL -> 400 BadRequestError")
    else:
        try:
            client.chat.completions.create(model=model, messages=msgs, max_tokens=8)
            check(False, "an image part without --mmproj is refused")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and "--mmproj" in str(e), "image part without --mmproj -> 400")


if __name__ == "__main__":
    main()
