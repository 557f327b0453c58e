#!/usr/bin/env bash
# Image encode time and peak RSS, deltaq against llama.cpp's llama-mtmd-cli, on the same synthetic mmproj,
# text model and image (docs/vision.md):
#
#   tools/vision-bench.sh SIZE MODEL [LLAMA_BIN_DIR]
#
# SIZE is 0.8b or 9b (the tower's shape; MODEL must be a text GGUF of the same size, e.g. the synthetic
# qwen35-SIZE-Q4_K_M.gguf of tools/synth-gguf.sh). The script writes, unless they exist, a synthetic mmproj of
# the real tower shape with F16 matrices (examples/vision_speed, KEEP=...) and a 1024 × 768 PNG (768 merged
# tokens) into $WORK (default target/vision-bench), then runs, R rounds (default 3), alternating which tool
# goes first:
#   deltaq run -m MODEL --mmproj MMPROJ --image IMG -p describe -n 1 -t T      ("encoded in N ms")
#   llama-mtmd-cli -m MODEL --mmproj MMPROJ --image IMG -p describe -n 1 -t T
#     ("image slice encoded in N ms", or in llama.cpp 0c1e57098 "mtmd batch encoding done in N ms")
# each under /usr/bin/time -v (peak RSS of the whole process: text model, mmproj and buffers), and prints
# the medians. DELTAQ_ARGS: extra deltaq flags (e.g. --image-arith bf16). T = threads (default 2); TYPE = the mmproj's matrix type (default f16). LLAMA_BIN_DIR
# defaults to target/llama-bench/build/bin (tools/llama-bench-build.sh); without llama-mtmd-cli there,
# only deltaq runs. Logs stay in $WORK/logs.
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:?usage: tools/vision-bench.sh 0.8b|9b MODEL [LLAMA_BIN_DIR]}
model=${2:?usage: tools/vision-bench.sh 0.8b|9b MODEL [LLAMA_BIN_DIR]}
llama_bin=${3:-target/llama-bench/build/bin}
R=${R:-3}
T=${T:-2}
TYPE=${TYPE:-f16}
WORK=${WORK:-target/vision-bench}
mkdir -p "$WORK/logs"
mmproj="$WORK/mmproj-$size-$TYPE.gguf"
img="$WORK/image-1024x768.png"

cargo build --release --quiet --bin deltaq --example vision_speed
deltaq=target/release/deltaq
if [ ! -f "$mmproj" ]; then
  KEEP="$mmproj" target/release/examples/vision_speed "$size" "$TYPE" "$T" 1
fi
if [ ! -f "$img" ]; then
  # A smooth colour pattern with noise (deterministic), 1024 × 768 RGB, as an uncompressed-filter PNG.
  python3 - "$img" <<'EOF'
import random, struct, sys, zlib
w, h = 1024, 768
rng = random.Random(7)
rows = bytearray()
for y in range(h):
    rows.append(0)
    for x in range(w):
        rows += bytes(((x * 255 // w + rng.randrange(32)) % 256,
                       (y * 255 // h + rng.randrange(32)) % 256,
                       ((x + y) % 256 + rng.randrange(32)) % 256))
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
png += chunk(b"IDAT", zlib.compress(bytes(rows), 6)) + chunk(b"IEND", b"")
open(sys.argv[1], "wb").write(png)
EOF
fi
mtmd="$llama_bin/llama-mtmd-cli"
tools=(deltaq)
[ -x "$mtmd" ] && tools+=(llama) || echo "no $mtmd: measuring deltaq only" >&2

run_one() { # TOOL ROUND -> appends "TOOL encode_ms rss_kib" to $WORK/results
  local tool=$1 log="$WORK/logs/$1-$2.log"
  case $tool in
    deltaq) /usr/bin/time -v "$deltaq" run -m "$model" --mmproj "$mmproj" --image "$img" \
              -p describe -n 1 -t "$T" --temp 0 ${DELTAQ_ARGS:-} >"$log" 2>&1 ;;
    llama) /usr/bin/time -v "$mtmd" -m "$model" --mmproj "$mmproj" --image "$img" \
              -p describe -n 1 -t "$T" --temp 0 >"$log" 2>&1 ;;
  esac
  local ms rss
  case $tool in
    deltaq) ms=$(grep -o 'encoded in [0-9.]* ms' "$log" | grep -o '[0-9.]*' | head -1) ;;
    llama) ms=$(grep -oE '(image slice encoded|mtmd batch encoding done) in [0-9.]+ ms' "$log" |
             grep -oE '[0-9.]+' | head -1) ;;
  esac
  rss=$(grep 'Maximum resident set size' "$log" | grep -o '[0-9]*$')
  [ -n "$ms" ] || { echo "$tool: no encode time in $log" >&2; exit 1; }
  echo "$tool $ms $rss" | tee -a "$WORK/results"
}

: >"$WORK/results"
for r in $(seq 1 "$R"); do
  if [ $((r % 2)) -eq 1 ]; then order=("${tools[@]}"); else order=($(printf '%s\n' "${tools[@]}" | tac)); fi
  for t in "${order[@]}"; do run_one "$t" "$r"; done
done

echo "$size tower ($TYPE mmproj), 1024x768 image, $T threads, $R rounds; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$WORK/results" <<'EOF'
import statistics, sys
res = {}
for line in open(sys.argv[1]):
    tool, ms, rss = line.split()
    res.setdefault(tool, []).append((float(ms), int(rss)))
for tool, v in res.items():
    ms = sorted(x[0] for x in v)
    print(f"{tool:7} encode median {statistics.median(ms):9.0f} ms (all: {', '.join(f'{x:.0f}' for x in ms)}), "
          f"peak RSS median {statistics.median(x[1] for x in v) / 1024:7.0f} MiB")
if len(res) == 2:
    print(f"llama.cpp / deltaq encode time: "
          f"{statistics.median(x[0] for x in res['llama']) / statistics.median(x[0] for x in res['deltaq']):.2f}x")
EOF
