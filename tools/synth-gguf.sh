#!/usr/bin/env bash
# Writes full-size synthetic Qwen3.5 GGUFs: random weights of realistic scale with the real tensor names,
# shapes and metadata (tools/make_fake_checkpoint.py), converted and quantized by deltaq itself.
#
#   tools/synth-gguf.sh SIZE TYPE...        e.g.  tools/synth-gguf.sh 0.8b q4_k_m q8_0 f16
#
# SIZE: 0.8b, 2b, 4b or 9b (spec/qwen35.md shapes). TYPE: any `deltaq convert --outtype` (f16, q8_0,
# q4_k_m, ...). Output: $OUT_DIR/qwen35-SIZE-TYPE.gguf (TYPE upper-cased, e.g. qwen35-0.8b-Q4_K_M.gguf).
#
# Environment:
#   OUT_DIR         output folder (default: synth, relative to the current directory)
#   TOKENIZER_GGUF  vocab-only GGUF whose tokenizer the files get (default: the real 248k Qwen3.5
#                   vocabulary of the shared fixtures, ../shared/fixtures/tokenizer/ggml-vocab-qwen35.gguf
#                   next to the repository, as tools/fetch-fixtures.sh expects them)
#   DELTAQ          the deltaq binary (default: target/release/deltaq of this repository, built if missing)
#   NO_MTP=1        leave the MTP block out (deltaq convert --no-mtp)
#   KEEP_CHECKPOINT=1  keep the BF16 safetensors checkpoint ($OUT_DIR/ckpt-SIZE; ~1.6 GB for 0.8b,
#                   ~19 GB for 9b) instead of deleting it
#
# The checkpoint is written once per call and every TYPE converted from it, so all files of one call
# hold the same weights. Same seed, same weights: the files are reproducible.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
size=$1
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
out_dir=${OUT_DIR:-synth}
tokenizer=${TOKENIZER_GGUF:-$repo/../shared/fixtures/tokenizer/ggml-vocab-qwen35.gguf}
deltaq=${DELTAQ:-$repo/target/release/deltaq}
case $size in
    0.8b | 2b | 4b | 9b) ;;
    *) echo "error: unknown size '$size' (one of 0.8b 2b 4b 9b)" >&2; exit 2 ;;
esac
if [[ ! -f $tokenizer ]]; then
    echo "error: no tokenizer GGUF at $tokenizer (set TOKENIZER_GGUF)" >&2
    exit 1
fi
if [[ ! -x $deltaq ]]; then
    if [[ -n ${DELTAQ:-} ]]; then
        echo "error: DELTAQ=$deltaq is not an executable" >&2
        exit 1
    fi
    (cd "$repo" && cargo build --release)
fi
mtp=()
[[ ${NO_MTP:-0} == 1 ]] && mtp=(--no-mtp)

mkdir -p "$out_dir"
ckpt=$out_dir/ckpt-$size
python3 "$repo/tools/make_fake_checkpoint.py" "$ckpt" --size "$size" --tokenizer-gguf "$tokenizer"
for t in "$@"; do
    name=$out_dir/qwen35-$size-${t^^}.gguf
    # Write under a temporary name: a reader that has the old file mapped keeps a valid mapping.
    "$deltaq" convert "$ckpt" -o "$name.tmp" --outtype "$t" --force --model-name "qwen35-$size-synthetic" "${mtp[@]}"
    mv -f "$name.tmp" "$name"
    echo "$name"
done
if [[ ${KEEP_CHECKPOINT:-0} != 1 ]]; then
    rm -rf "$ckpt"
fi
