#!/usr/bin/env bash
# Copies the reference files the tests need from ../shared/fixtures (beside the clone, as in CI) into
# tests/fixtures/shared/ (not committed: they are large and can be copied again at any time).
set -euo pipefail
cd "$(dirname "$0")/.."
src=${DELTAQ_FIXTURES:-../shared/fixtures}
dst=tests/fixtures/shared
if [ ! -d "$src" ]; then
  echo "fetch-fixtures: $src not found (set DELTAQ_FIXTURES to the shared fixtures folder)" >&2
  exit 1
fi
mkdir -p "$dst"
copy() { # copy SRC_RELATIVE_PATH...: keeps the folder structure under $dst
  for f in "$@"; do
    mkdir -p "$dst/$(dirname "$f")"
    cmp -s "$src/$f" "$dst/$f" 2>/dev/null || cp "$src/$f" "$dst/$f"
  done
}

# Quantization: llama-quantize's outputs of tiny-r2 and their source (tests/quantize_files.rs).
copy tiny-r2/tiny-r2-F32.gguf tiny-r2/quant/types.tsv
for f in "$src"/tiny-r2/quant/*.gguf; do copy "tiny-r2/quant/$(basename "$f")"; done

# Forward pass: the tiny models and their transformers goldens (tests/model_golden.rs).
for m in tiny-r1 tiny-r2; do
  copy "$m/$m-F32.gguf" "$m/$m-F16.gguf"
  for g in tokens logits_f64 logits_step_f64 residual_f64; do copy "$m/golden/$g.npy"; done
done

# Tokenizer, chat template, `deltaq tokenize` (tests/tokenizer.rs): the real 248k Qwen3.5 vocabulary with
# llama.cpp's 50 test strings and their ids; tiny-kjv's tokenizer.json (the reference the test checks a
# GGUF built from it against) and the text it is compared on.
copy tokenizer/ggml-vocab-qwen35.gguf tokenizer/ggml-vocab-qwen35.gguf.inp tokenizer/ggml-vocab-qwen35.gguf.out
copy tiny-kjv/hf/tokenizer.json tiny-kjv/hf/tokenizer_config.json text/eval-john.txt

# Conversion (tests/convert.rs): the fixture checkpoints and llama.cpp's conversions of them.
for m in tiny-r1 tiny-r2; do
  for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
    copy "$m/hf/$f"
  done
  copy "$m/$m-F32.gguf" "$m/$m-F16.gguf"
done

# Vision conversion (tests/convert_mmproj.rs): the tiny-v1 vision-language checkpoint and llama.cpp's text
# and mmproj conversions of it.
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json \
  chat_template.jinja preprocessor_config.json; do
  copy "tiny-v1/hf/$f"
done
copy tiny-v1/tiny-v1-F32.gguf tiny-v1/mmproj-tiny-v1-F32.gguf tiny-v1/mmproj-tiny-v1-F16.gguf

# tiny-kjv: the trained model's checkpoint and transformers goldens (tests/kjv_golden.rs).
copy tiny-kjv/hf/config.json tiny-kjv/hf/generation_config.json tiny-kjv/hf/model.safetensors
copy tiny-kjv/golden/tokens.npy tiny-kjv/golden/logits.npy tiny-kjv/golden/layer_outputs.npy \
  tiny-kjv/golden/embeddings.npy tiny-kjv/golden/final_hidden.npy

# tiny-kjv-mtp: tiny-kjv with a trained MTP block: checkpoint, llama.cpp's quantized files and the
# float64 goldens of the block (tests/mtp.rs).
copy tiny-kjv-mtp/hf/config.json tiny-kjv-mtp/hf/generation_config.json tiny-kjv-mtp/hf/model.safetensors \
  tiny-kjv-mtp/hf/tokenizer.json tiny-kjv-mtp/hf/tokenizer_config.json \
  tiny-kjv-mtp/tiny-kjv-mtp-Q8_0.gguf tiny-kjv-mtp/tiny-kjv-mtp-Q4_K_M.gguf
for g in tokens trunk_hidden mtp_logits mtp_activations chain_starts chain_tokens chain_logits chain_hidden \
  llama_q8_0_mtp_logits; do
  copy "tiny-kjv-mtp/golden/$g.npy"
done

# Image preprocessing (tests/vision_preprocess.rs): tiny-v1's test images, the processor's resized images
# and its pixel_values / image_grid_thw.
for i in 0 1 2; do
  copy "tiny-v1/images/img$i.png" "tiny-v1/images/img${i}_resized.png"
  copy "tiny-v1/golden/img${i}_pixel_values.npy" "tiny-v1/golden/img${i}_grid_thw.npy"
done

# Vision tower (tests/vision_tower.rs): tiny-v1's mmproj files, the processor's pixel_values and grids of
# its three images, and transformers' float64 tower outputs (merger, per block, position embeddings).
copy tiny-v1/mmproj-tiny-v1-F32.gguf tiny-v1/mmproj-tiny-v1-F16.gguf
for i in 0 1 2; do
  copy "tiny-v1/golden/img${i}_pixel_values.npy" "tiny-v1/golden/img${i}_grid_thw.npy" \
    "tiny-v1/golden/img${i}_vision_out_f64.npy"
done
copy tiny-v1/golden/img0_vision_blocks_f64.npy tiny-v1/golden/img0_pos_embeds_f64.npy

# tiny-v1: the vision-language fixture's text model with the transformers goldens of its image prompts
# (image embeddings injected) and of a text-only prompt (tests/vision_text.rs).
copy tiny-v1/tiny-v1-F32.gguf tiny-v1/golden/text_input_ids.npy tiny-v1/golden/text_logits_f64.npy
for c in chat0 chat1 chat2; do
  for g in input_ids position_ids logits_f64 greedy; do copy "tiny-v1/golden/${c}_$g.npy"; done
done
for i in img0 img1 img2; do copy "tiny-v1/golden/${i}_vision_out_f64.npy" "tiny-v1/golden/${i}_grid_thw.npy"; done
