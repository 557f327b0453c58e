#!/usr/bin/env bash
# Self-speculative decoding on a full-size file (too slow for every CI run): greedy text with 1, 2 and 3
# drafts per step (drafting forced on) must equal the text without drafts, on every kernel table this CPU
# runs; then `deltaq bench --draft` for the cost of a speculative step.
#
#   tools/mtp-check.sh FILE.gguf [N_TOKENS]        e.g. tools/mtp-check.sh synth/qwen35-0.8b-Q4_K_M.gguf 64
#
# A file with random weights (tools/synth-gguf.sh) accepts no drafts, so every step rolls back: this checks
# the rollback on real shapes. DELTAQ: the binary (default target/release/deltaq, built if missing).
set -euo pipefail
[[ $# -ge 1 ]] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
file=$1
n=${2:-64}
repo=$(cd "$(dirname "$0")/.." && pwd)
deltaq=${DELTAQ:-$repo/target/release/deltaq}
[[ -x $deltaq ]] || (cd "$repo" && cargo build --release --locked)
prompt="The quick brown fox jumps over the lazy dog, and then"
# The kernel tables this CPU runs (DELTAQ_ISA warns about the others).
isas=""
for i in scalar avx2 avx512 neon neon-dotprod; do
  warn=$(DELTAQ_ISA=$i "$deltaq" run -m "$file" --raw -p x -n 1 -t 1 --draft 0 2>&1 >/dev/null || true)
  [[ $warn == *"not available"* ]] || isas+=" $i"
done
status=0
for isa in $isas; do
  want=$(DELTAQ_ISA=$isa "$deltaq" run -m "$file" --raw -p "$prompt" -n "$n" --temp 0 --draft 0 2>/dev/null)
  for k in 1 2 3; do
    got=$(DELTAQ_ISA=$isa "$deltaq" run -m "$file" --raw -p "$prompt" -n "$n" --temp 0 --draft "$k" \
      --draft-always 2>/dev/null)
    if [[ $got == "$want" ]]; then
      echo "mtp-check: $isa --draft $k: same $n tokens as --draft 0"
    else
      echo "mtp-check: $isa --draft $k: DIFFERENT text from --draft 0" >&2
      status=1
    fi
  done
done
for k in 1 2 3; do
  "$deltaq" bench -m "$file" -p 0 -n 16 -r 5 --draft "$k" 2>/dev/null | tail -n 3
done
exit $status
