#!/usr/bin/env python3
"""A bounded load test of a running `deltaq serve` (loopback only; fixed request counts, a time limit):

1. CLIENTS concurrent streaming chat clients, each sending REQUESTS requests one after the other;
   every stream must be complete and well-formed (JSON chunks, one id, one finish_reason, [DONE]).
2. MALFORMED malformed requests of assorted kinds; every one must get a 4xx JSON error, and the
   server must still answer a valid request afterwards.

    deltaq serve --port 8080 --parallel 4 --queue 16 &
    python3 tools/load_test.py --base-url http://127.0.0.1:8080

Standard library only. Exits non-zero if a check fails.
"""

import argparse
import http.client
import json
import socket
import statistics
import sys
import threading
import time
import urllib.parse


def stream_once(host, port, body, deadline):
    conn = http.client.HTTPConnection(host, port, timeout=max(1.0, deadline - time.monotonic()))
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status == 503:
        r.read()
        conn.close()
        return {"status": 503}
    if r.status != 200:
        raise AssertionError(f"HTTP {r.status}")
    ids, finishes, ttft, done, tokens = set(), 0, None, False, 0
    for raw in r:
        line = raw.decode().strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        ev = json.loads(data)
        assert "error" not in ev, ev
        ids.add(ev["id"])
        for c in ev["choices"]:
            if c["delta"].get("content") and ttft is None:
                ttft = time.perf_counter() - t0
            if c["finish_reason"]:
                finishes += 1
                tokens = ev["usage"]["completion_tokens"]
    conn.close()
    assert done and finishes == 1 and len(ids) == 1, (done, finishes, ids)
    return {"status": 200, "latency": time.perf_counter() - t0, "ttft": ttft, "tokens": tokens}


MALFORMED = [
    ("POST", "/v1/chat/completions", b"{not json"),
    ("POST", "/v1/chat/completions", b"[1,2,3]"),
    ("POST", "/v1/chat/completions", b'{"messages": "hello"}'),
    ("POST", "/v1/chat/completions", b'{"messages": []}'),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": 1}]}'),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}'),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}'),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}'),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "stop": {"a": 1}}'),
    ("POST", "/v1/completions", b'{"prompt": 42}'),
    ("POST", "/v1/completions", b'{"prompt": [1, -1]}'),
    ("POST", "/v1/completions", b'{"prompt": "x", "n": 3}'),
    ("POST", "/detokenize", b'{"tokens": ["a"]}'),
    ("POST", "/tokenize", b'{}'),
    ("GET", "/v1/chat/completions", b""),
    ("POST", "/v1/unknown", b"{}"),
    ("POST", "/v1/chat/completions", b"\xff\xfe\x00garbage"),
]


def malformed(host, port, i):
    method, path, body = MALFORMED[i % len(MALFORMED)]
    if i % len(MALFORMED) == len(MALFORMED) - 1 and i % 2 == 0:
        # Raw garbage instead of HTTP.
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        resp = s.recv(4096)
        s.close()
        status = int(resp.split()[1]) if resp.startswith(b"HTTP/1.1") else 0
        return status, None
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    try:
        err = json.loads(data)["error"]
        shaped = all(k in err for k in ("message", "type", "param", "code"))
    except (ValueError, KeyError, TypeError):
        shaped = False
    return r.status, shaped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=5, help="per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--malformed", type=int, default=100)
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds, for the whole test")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.base_url)
    host, port = u.hostname, u.port or 80
    deadline = time.monotonic() + a.time_limit
    results, errors = [], []
    lock = threading.Lock()

    def client(c):
        for k in range(a.requests):
            if time.monotonic() > deadline:
                return
            body = {"messages": [{"role": "user", "content": f"Client {c} asks question {k}: who was Moses?"}],
                    "stream": True, "max_tokens": a.max_tokens, "ignore_eos": True, "seed": c * 100 + k,
                    "chat_template_kwargs": {"enable_thinking": False}}
            try:
                r = stream_once(host, port, body, deadline)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                r = {"status": "error", "error": repr(e)}
            with lock:
                (results if r["status"] == 200 else errors).append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = len(results)
    total_tokens = sum(r["tokens"] for r in results)
    lat = sorted(r["latency"] for r in results)
    ttft = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    print(f"streaming: {a.clients} clients x {a.requests} requests, {a.max_tokens} tokens each: "
          f"{ok} complete, {len(errors)} failed/refused in {wall:.1f} s")
    if ok:
        print(f"  {total_tokens} tokens, {total_tokens / wall:.1f} tokens/s aggregate; latency median "
              f"{statistics.median(lat):.2f} s, max {lat[-1]:.2f} s; TTFT median {statistics.median(ttft) * 1e3:.0f} ms, "
              f"max {ttft[-1] * 1e3:.0f} ms")
    for e in errors[:5]:
        print("  ", e)

    t0 = time.perf_counter()
    statuses, unshaped, raw = {}, 0, 0
    for i in range(a.malformed):
        st, shaped = malformed(host, port, i)
        statuses[st] = statuses.get(st, 0) + 1
        if shaped is None:
            raw += 1
        elif not shaped:
            unshaped += 1
    bad = sum(n for st, n in statuses.items() if not 400 <= st < 500)
    print(f"malformed: {a.malformed} requests in {time.perf_counter() - t0:.2f} s: status counts "
          f"{dict(sorted(statuses.items()))}; {unshaped} HTTP requests without the JSON error shape; "
          f"{raw} of them were not HTTP at all (answered by hyper's bare 400)")
    after = stream_once(host, port, {"messages": [{"role": "user", "content": "Still there?"}], "stream": True,
                                     "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}},
                        time.monotonic() + 60)
    print(f"after: a valid request -> HTTP {after['status']}")
    if errors or bad or unshaped or after["status"] != 200:
        sys.exit(1)


if __name__ == "__main__":
    main()
