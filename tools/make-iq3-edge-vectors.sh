#!/usr/bin/env bash
# Reference digests for the IQ3 quantizers' zero and near-zero sub-blocks: tiny-r2's blk.0.ffn_up.weight
# with rows edited (row % 4 == 0: sub-blocks 1 and 4 of each 256 zeroed; 1: sub-blocks 2 and 6 times
# 1e-10, below IQ3_XXS's 1e-8 threshold; 2: the row's first 256 values zeroed; 3: unchanged), quantized
# by llama-quantize --pure to IQ3_XXS and IQ3_S with tiny-r2's importance matrix and to IQ3_S without.
# Writes tests/fixtures/imatrix/quant/edge-IQ3.tsv: label, type and SHA-256 of that tensor's data.
#   tools/make-iq3-edge-vectors.sh LLAMA_BIN_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: tools/make-iq3-edge-vectors.sh LLAMA_BIN_DIR}
src=tests/fixtures/shared/tiny-r2/tiny-r2-F32.gguf
imx=tests/fixtures/imatrix/tiny-r2.imatrix.gguf
out=tests/fixtures/imatrix/quant/edge-IQ3.tsv
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$src" "$tmp/edited.gguf"
chmod u+w "$tmp/edited.gguf"
python3 - "$tmp/edited.gguf" <<'PY'
import sys
import numpy as np
import gguf
r = gguf.GGUFReader(sys.argv[1], "r+")
t = next(t for t in r.tensors if t.name == "blk.0.ffn_up.weight")
x = t.data  # memmap of [rows, 256] f32, written through
for row in range(x.shape[0]):
    for b in range(0, x.shape[1], 256):
        blk = x[row, b:b + 256]
        if row % 4 == 0:
            blk[32:64] = 0
            blk[128:160] = 0
        elif row % 4 == 1:
            blk[64:96] *= np.float32(1e-10)
            blk[192:224] *= np.float32(1e-10)
    if row % 4 == 2:
        x[row, :256] = 0
x.flush() if hasattr(x, "flush") else None
PY
: >"$out"
for run in "imatrix IQ3_XXS" "imatrix IQ3_S" "noimatrix IQ3_S"; do
  set -- $run
  args=(--pure)
  [ "$1" = imatrix ] && args+=(--imatrix "$imx")
  "$bin/llama-quantize" "${args[@]}" "$tmp/edited.gguf" "$tmp/q.gguf" "$2" 2 >"$tmp/log" 2>&1 ||
    { tail -5 "$tmp/log" >&2; exit 1; }
  python3 - "$tmp/q.gguf" "$1" >>"$out" <<'PY'
import hashlib, sys
import gguf
r = gguf.GGUFReader(sys.argv[1])
t = next(t for t in r.tensors if t.name == "blk.0.ffn_up.weight")
print(f"{sys.argv[2]}\t{t.tensor_type.name}\t{hashlib.sha256(bytes(t.data)).hexdigest()}")
PY
done
cat "$out"
