#!/usr/bin/env python3
"""A multi-turn chat against a running `deltaq serve`: for each turn, the time to first token (first
streamed delta) and how many prompt tokens the server actually processed (the rest came from the
prompt cache). Standard library only.

    deltaq serve --port 8080 -c 4096 &
    python3 tools/conversation_ttft.py --base-url http://127.0.0.1:8080 --turns 10

Run it once more against a server started with --cache-mb 0 to see what the cache saves.
"""

import argparse
import http.client
import json
import sys
import time
import urllib.parse

QUESTIONS = [
    "Tell me of the creation of the heaven and the earth, and of the light and the darkness.",
    "And what did God say unto Noah when the waters covered the face of all the earth?",
    "Who led the children of Israel out of the land of Egypt, and through the Red sea?",
    "What were the words that were written upon the tables of stone on the mount?",
    "Tell me of David the son of Jesse, and of the giant of the Philistines in the valley.",
    "What did Solomon ask of the Lord when the Lord appeared unto him in a dream by night?",
    "Tell me of Daniel in the den of lions, and of the king that sealed the stone.",
    "What did the prophet Jonah do when the Lord sent him unto the great city of Nineveh?",
    "Tell me of the walls of Jericho, and of the trumpets of the priests on the seventh day.",
    "What came to pass when Elijah called down fire upon the altar on mount Carmel?",
    "Tell me of Ruth the Moabitess, and of the fields of Boaz in the time of the harvest.",
    "What did the Lord say unto Job out of the whirlwind, of the foundations of the earth?",
]


def stream_chat(conn, path, body):
    """POSTs a streaming chat request; returns (ttft seconds, reply text, final usage, timings)."""
    t0 = time.perf_counter()
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, text, usage, timings = None, "", None, None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            continue  # read on to the end of the body, so the connection can be reused
        ev = json.loads(data)
        for c in ev.get("choices", []):
            d = c.get("delta", {})
            piece = (d.get("content") or "") + (d.get("reasoning_content") or "")
            if piece and ttft is None:
                ttft = time.perf_counter() - t0
            text += d.get("content") or ""
            if c.get("finish_reason"):
                usage, timings = ev.get("usage"), ev.get("timings")
    return ttft, text, usage, timings


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--json", help="write the per-turn figures here")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=300)
    messages = [{"role": "system", "content": "You are a scribe who answers in the words of the King James Bible."}]
    rows = []
    print(f"{'turn':>4} {'prompt':>7} {'cached':>7} {'new':>5} {'prompt ms':>10} {'TTFT ms':>8}")
    for turn in range(a.turns):
        messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        body = {"messages": messages, "stream": True, "max_tokens": a.max_tokens, "ignore_eos": True,
                "temperature": 0.7, "seed": turn, "chat_template_kwargs": {"enable_thinking": False}}
        ttft, text, usage, timings = stream_chat(conn, "/v1/chat/completions", body)
        messages.append({"role": "assistant", "content": text})
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        row = {"turn": turn + 1, "prompt_tokens": usage["prompt_tokens"], "cached_tokens": cached,
               "processed_tokens": usage["prompt_tokens"] - cached, "prompt_ms": timings["prompt_ms"],
               "ttft_ms": (ttft or 0) * 1e3}
        rows.append(row)
        print(f"{row['turn']:>4} {row['prompt_tokens']:>7} {cached:>7} {row['processed_tokens']:>5} "
              f"{row['prompt_ms']:>10.1f} {row['ttft_ms']:>8.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
