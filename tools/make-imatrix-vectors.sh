#!/usr/bin/env bash
# Reference digests for `deltaq quantize --imatrix`: llama-quantize --imatrix on the tiny-r2 F32 fixture
# with llama-imatrix's matrix (tests/fixtures/imatrix), every weight type pure and every ftype recipe.
# (pure-IQ2_*/IQ1_* with token_embd and output in Q4_K.) Writes tests/fixtures/imatrix/quant/<name>.tsv: per tensor, name, type and the SHA-256 of its data
# (the files themselves are too large to keep; a digest still fails on any differing byte).
#   tools/make-imatrix-vectors.sh LLAMA_BIN_DIR [NAME ...]
# NAME: pure-<TYPE>, an ftype (IQ2_M, Q4_K_M, ...), or tt-<FTYPE> (the ftype with the --tensor-type
# overrides below); default: all of them.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: tools/make-imatrix-vectors.sh LLAMA_BIN_DIR [NAME ...]}
shift
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for t in Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS IQ3_XXS IQ3_S IQ2_XXS IQ2_XS IQ2_S IQ1_S IQ1_M; do
    names+=("pure-$t")
  done
  names+=(Q2_K Q2_K_S Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K
          IQ4_NL IQ4_XS IQ3_XXS IQ3_XS IQ3_S IQ3_M IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ1_S IQ1_M tt-Q4_K_M tt-IQ2_M)
fi
src=tests/fixtures/shared/tiny-r2/tiny-r2-F32.gguf
imx=tests/fixtures/imatrix/tiny-r2.imatrix.gguf
out=tests/fixtures/imatrix/quant
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for name in "${names[@]}"; do
  ftype=${name#pure-}
  ftype=${ftype#tt-}
  # A pure file of a type takes an ftype whose default type it is.
  case $name in pure-Q3_K) ftype=Q3_K_M ;; pure-Q4_K) ftype=Q4_K_M ;; pure-Q5_K) ftype=Q5_K_M ;; pure-IQ2_S) ftype=IQ2_M ;; esac
  pure=()
  [ "$name" != "${name#pure-}" ] && pure=(--pure)
  # The 1- and 2-bit types need an imatrix, which llama-imatrix has no entry for on token_embd and
  # output: their pure files keep those two in Q4_K.
  case $name in pure-IQ2_* | pure-IQ1_*) pure+=(--token-embedding-type q4_K --output-tensor-type q4_K) ;; esac
  # tt-: the first matching pattern wins, and an overridden tensor skips the recipe's per-layer
  # counters (blk.1's ffn_down shifts the layer the later ffn_down rules see). Keep in step with
  # tensor_type_args in tests/quantize_imatrix.rs.
  case $name in
    tt-Q4_K_M) pure+=(--tensor-type 'blk\.1\.ffn_down=q8_0' --tensor-type 'attn_(k|q)=q5_K' --tensor-type 'attn_k=q4_0') ;;
    tt-IQ2_M) pure+=(--tensor-type 'blk\.1\.=q4_K' --tensor-type 'FFN_UP=iq3_s') ;;
  esac
  "$bin/llama-quantize" "${pure[@]}" --imatrix "$imx" "$src" "$tmp/q.gguf" "$ftype" 2 >"$tmp/log" 2>&1 ||
    { echo "llama-quantize failed for $name:" >&2; tail -5 "$tmp/log" >&2; exit 1; }
  python3 - "$tmp/q.gguf" >"$out/$name.tsv" <<'PY'
import hashlib, sys
import gguf
r = gguf.GGUFReader(sys.argv[1])
for t in r.tensors:
    print(f"{t.name}\t{t.tensor_type.name}\t{hashlib.sha256(bytes(t.data)).hexdigest()}")
PY
  echo "$name: $(cut -f2 "$out/$name.tsv" | sort | uniq -c | tr -s ' ' | tr '\n' ',')"
done
