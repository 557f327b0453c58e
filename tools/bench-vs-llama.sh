#!/usr/bin/env bash
# Measures deltaq and llama.cpp's llama-bench on the same GGUF files, interleaved, and prints their speeds
# and ratios.
#
#   tools/bench-vs-llama.sh FILE...
#
# For every file, thread count and test (ppP, tgN) the two tools run one after the other with the same
# -p/-n/-t/-r, the order alternating from test to test and round to round so that a slow phase of a shared
# machine hits both. Each tool reports its repetitions (llama-bench -o jsonl, deltaq bench --json); the table
# gives the median over every repetition of every round, and the ratio deltaq / llama.cpp of the medians.
#
# Environment (defaults in brackets):
#   P [512]  N [128]  T [1,2]  R [5]     prompt length, generated tokens, thread counts, repetitions per run
#   ROUNDS [1]                            how many times the whole interleaved sequence runs
#   LLAMA_BENCH [target/llama-bench/build/bin/llama-bench]   built by tools/llama-bench-build.sh
#   DELTAQ [target/release/deltaq]        the deltaq binary (built with cargo build --release if missing)
#   OUT [target/bench-vs-llama/<time>]    folder for the raw JSON lines (llama.jsonl, deltaq.jsonl)
#   DELTAQ_ARGS, LLAMA_ARGS               extra arguments for either tool
set -euo pipefail

if [[ $# -lt 1 ]]; then
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
p=${P:-512}
n=${N:-128}
threads=${T:-1,2}
reps=${R:-5}
rounds=${ROUNDS:-1}
llama=${LLAMA_BENCH:-$repo/target/llama-bench/build/bin/llama-bench}
deltaq=${DELTAQ:-$repo/target/release/deltaq}
out=${OUT:-$repo/target/bench-vs-llama/$(date -u +%Y%m%dT%H%M%SZ)}
read -r -a deltaq_args <<< "${DELTAQ_ARGS:-}"
read -r -a llama_args <<< "${LLAMA_ARGS:-}"

if [[ ! -x $llama ]]; then
    echo "error: no llama-bench at $llama (run tools/llama-bench-build.sh, or set LLAMA_BENCH)" >&2
    exit 1
fi
if [[ ! -x $deltaq ]]; then
    if [[ -n ${DELTAQ:-} ]]; then
        echo "error: DELTAQ=$deltaq is not an executable" >&2
        exit 1
    fi
    (cd "$repo" && cargo build --release)
fi
for f in "$@"; do
    [[ -f $f ]] || { echo "error: no such file: $f" >&2; exit 1; }
done
mkdir -p "$out"
: > "$out/llama.jsonl"
: > "$out/deltaq.jsonl"

run_tool() { # name log command...
    local name=$1 log=$2
    shift 2
    if ! "$@" > "$out/last.jsonl" 2>> "$log"; then
        echo "error: $name failed: $* (see $log)" >&2
        exit 1
    fi
    grep '^{' "$out/last.jsonl" >> "$out/$name.jsonl" || true
}
run_llama() { # file threads p n
    run_tool llama "$out/llama.log" "$llama" -m "$1" -t "$2" -p "$3" -n "$4" -r "$reps" -o jsonl "${llama_args[@]}"
}
run_deltaq() { # file threads p n
    run_tool deltaq "$out/deltaq.log" "$deltaq" bench -m "$1" -t "$2" -p "$3" -n "$4" -r "$reps" --json "${deltaq_args[@]}"
}

# Both tools map the file. How its page cache was filled decides the page size of those mappings: read
# sequentially, ext4 on a recent kernel caches it in 2 MiB folios that map with one TLB entry each;
# faulted in at random (an mmap run without huge-page advice), in small ones, and decoding is then up to
# 40% slower for either tool. So each file is dropped from the cache and read once, sequentially, before
# the runs (SETTLE=0 skips this).
if [[ ${SETTLE:-1} == 1 ]]; then
    for f in "$@"; do
        dd if="$f" iflag=nocache count=0 status=none 2> /dev/null || true
        cat "$f" > /dev/null
    done
fi

k=0
for ((round = 0; round < rounds; round++)); do
    for f in "$@"; do
        for t in ${threads//,/ }; do
            tests=()
            [[ $p != 0 ]] && tests+=("$p 0")
            [[ $n != 0 ]] && tests+=("0 $n")
            for pn in "${tests[@]}"; do
                read -r tp tn <<< "$pn"
                name=$([[ $tp != 0 ]] && echo "pp$tp" || echo "tg$tn")
                echo "round $((round + 1))/$rounds: $(basename "$f") $name, $t thread(s)" >&2
                if ((k % 2 == 0)); then
                    run_llama "$f" "$t" "$tp" "$tn"
                    run_deltaq "$f" "$t" "$tp" "$tn"
                else
                    run_deltaq "$f" "$t" "$tp" "$tn"
                    run_llama "$f" "$t" "$tp" "$tn"
                fi
                k=$((k + 1))
            done
        done
    done
done

echo "raw results: $out" >&2
python3 - "$out" <<'PY'
import json, os, statistics, sys

out = sys.argv[1]

def load(name):
    rows = {}
    with open(os.path.join(out, name)) as f:
        for line in f:
            v = json.loads(line)
            key = (os.path.basename(v["model_filename"]), int(v["n_threads"]), int(v["n_prompt"]), int(v["n_gen"]),
                   int(v.get("n_depth", 0)))
            rows.setdefault(key, []).append(v)
    return rows

def faster_llama(runs):
    """llama.cpp's runs of one test under its fastest setting (-fa lists), and that setting's name."""
    by_fa = {}
    for v in runs:
        by_fa.setdefault(v.get("flash_attn"), []).append(v)
    fa, best = max(by_fa.items(), key=lambda kv: statistics.median(x for v in kv[1] for x in v["samples_ts"]))
    return best, (f" (-fa {int(fa)})" if len(by_fa) > 1 else "")

ll, dq = load("llama.jsonl"), load("deltaq.jsonl")
head = ["model", "threads", "test", "llama.cpp t/s", "deltaq t/s", "ratio", "deltaq GB/s", "% of read BW",
        "deltaq peak RSS", "reps"]
table = [head]
for key in sorted(set(ll) | set(dq), key=lambda k: (k[0], k[1], k[4], k[3] > 0, k[2] + k[3])):
    f, t, np_, ng, depth = key
    runs, fa = faster_llama(ll[key]) if key in ll else ([], "")
    a = [x for v in runs for x in v["samples_ts"]]
    b = [x for v in dq.get(key, []) for x in v["samples_ts"]]
    ma = statistics.median(a) if a else None
    mb = statistics.median(b) if b else None
    last = dq[key][-1] if key in dq else {}
    gbps = last.get("weight_bytes_per_token", 0) * mb / 1e9 if (mb and ng) else None
    bw = statistics.median([v["read_bw_gbps"] for v in dq.get(key, [])]) if key in dq else None
    rss = max((v.get("peak_rss_bytes") or 0) for v in dq[key]) if key in dq else 0
    table.append([
        f, str(t), (f"pp{np_}" if np_ else f"tg{ng}") + (f" @ d{depth}" if depth else ""),
        f"{ma:.2f}{fa}" if ma else "-", f"{mb:.2f}" if mb else "-",
        f"{mb / ma:.2f}x" if ma and mb else "-",
        f"{gbps:.2f}" if gbps else "-",
        f"{100 * gbps / bw:.0f} % of {bw:.1f}" if gbps and bw else "-",
        f"{rss / 2**20:.0f} MiB" if rss else "-",
        f"{len(a)}/{len(b)}",
    ])
w = [max(len(r[c]) for r in table) for c in range(len(head))]
for i, r in enumerate(table):
    print("| " + " | ".join(s.ljust(w[c]) if c < 3 else s.rjust(w[c]) for c, s in enumerate(r)) + " |")
    if i == 0:
        print("|" + "|".join("-" * (w[c] + 2) if c < 3 else "-" * (w[c] + 1) + ":" for c in range(len(w))) + "|")
cpu = next((v["cpu_info"] for vs in dq.values() for v in vs), "?")
isa = next((v["isa"] for vs in dq.values() for v in vs), "?")
print(f"\ncpu: {cpu}; deltaq kernels: {isa}; medians of every repetition (reps = llama.cpp/deltaq); "
      "llama.cpp under its faster setting when LLAMA_ARGS lists several -fa values; "
      "ratio = deltaq / llama.cpp; GB/s = weight bytes per token x median tg speed")
PY
