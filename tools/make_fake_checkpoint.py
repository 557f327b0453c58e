#!/usr/bin/env python3
"""Writes a random BF16 Qwen3.5 checkpoint with the real tensor names and shapes, sharded like the
published ones (Qwen3_5ForConditionalGeneration naming, model.safetensors.index.json, MTP block), to
measure `deltaq convert` on full-size models without downloading one.

    tools/make_fake_checkpoint.py OUT_DIR [--size 9b|4b|2b|0.8b] [--shard-gb 5] [--vision]
                                  [--tokenizer-from HF_DIR | --tokenizer-gguf VOCAB_GGUF]

Only numpy is needed. Values have a realistic scale so that a model made from them runs with finite,
unit-scale activations: matrices N(0, 1/sqrt(n_in)) (token embedding / LM head N(0, 0.02)), conv taps
N(0, 0.5), zero-centred RMSNorm weights (stored +0, the converter adds 1) N(0, 0.1), the gated DeltaNet
norm 1 + N(0, 0.1), A_log = log U(1, 16) and dt_bias 1 + N(0, 0.1) as transformers initialises them.
Standard normals are drawn once into a pool that the tensors reuse at varying offsets (one scaled BF16
copy per scale), so writing is disk-bound. Put the output outside the repository (it is ~19 GB for 9b).

--vision adds the vision tower (model.visual.*, the full vision_config and preprocessor_config.json) for
the sizes whose tower shape is known (0.8b, 9b): Conv3d patch embedding N(0, 1/sqrt(1536)), position
table N(0, 0.5), LayerNorm weights 1 + N(0, 0.1), biases N(0, 0.1), matrices as above.

The tokenizer: --tokenizer-from copies tokenizer.json / tokenizer_config.json from a Hugging Face folder;
--tokenizer-gguf rebuilds them from a vocab-only GGUF (tokens, types, merges, special ids, chat template),
e.g. the real 248,320-token Qwen3.5 vocabulary of the shared tokenizer fixture.
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np

SIZES = {
    # hidden, layers, ffn, heads, kv heads, linear key heads, linear value heads, tied
    "0.8b": (1024, 24, 3584, 8, 2, 16, 16, True),
    "2b": (2048, 24, 6144, 8, 2, 16, 16, True),
    "4b": (2560, 32, 9216, 16, 4, 16, 32, True),
    "9b": (4096, 32, 12288, 16, 4, 16, 32, False),
}
VOCAB, HEAD_DIM, LIN_DIM, CONV = 248320, 256, 128, 4
VISION = {
    # depth, width, heads, FFN (the output width is the text model's hidden size)
    "0.8b": (12, 768, 12, 3072),
    "9b": (27, 1152, 16, 4304),
}
PATCH, POS_SIDE = 16, 48
PREPROCESSOR = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": PATCH, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
}


def vision_tensors(size):
    depth, h, _, ff = VISION[size]
    out_dim, m4 = SIZES[size][0], 4 * h
    v = "model.visual."
    out = [(v + "patch_embed.proj.weight", (h, 3, 2, PATCH, PATCH), "conv"),
           (v + "patch_embed.proj.bias", (h,), "norm"),
           (v + "pos_embed.weight", (POS_SIDE * POS_SIDE, h), "pos"),
           (v + "merger.norm.weight", (h,), "one"),
           (v + "merger.norm.bias", (h,), "norm"),
           (v + "merger.linear_fc1.weight", (m4, m4), "w"),
           (v + "merger.linear_fc1.bias", (m4,), "norm"),
           (v + "merger.linear_fc2.weight", (out_dim, m4), "w"),
           (v + "merger.linear_fc2.bias", (out_dim,), "norm")]
    for i in range(depth):
        b = f"{v}blocks.{i}."
        out += [(b + "norm1.weight", (h,), "one"), (b + "norm1.bias", (h,), "norm"),
                (b + "norm2.weight", (h,), "one"), (b + "norm2.bias", (h,), "norm"),
                (b + "attn.qkv.weight", (3 * h, h), "w"), (b + "attn.qkv.bias", (3 * h,), "norm"),
                (b + "attn.proj.weight", (h, h), "w"), (b + "attn.proj.bias", (h,), "norm"),
                (b + "mlp.linear_fc1.weight", (ff, h), "w"), (b + "mlp.linear_fc1.bias", (ff,), "norm"),
                (b + "mlp.linear_fc2.weight", (h, ff), "w"), (b + "mlp.linear_fc2.bias", (h,), "norm")]
    return out


def vision_config(size):
    depth, h, heads, ff = VISION[size]
    return {"depth": depth, "hidden_size": h, "num_heads": heads, "intermediate_size": ff,
            "out_hidden_size": SIZES[size][0], "hidden_act": "gelu_pytorch_tanh", "patch_size": PATCH,
            "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3,
            "num_position_embeddings": POS_SIDE * POS_SIDE, "deepstack_visual_indexes": [],
            "initializer_range": 0.02, "model_type": "qwen3_5_vision",
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"}}


def tensors(size):
    d, n_layer, ff, h, kv, hk, hv, tied = SIZES[size]
    conv_ch = 2 * hk * LIN_DIM + hv * LIN_DIM
    out = [("model.language_model.embed_tokens.weight", (VOCAB, d), "emb"),
           ("model.language_model.norm.weight", (d,), "norm")]
    if not tied:
        out.append(("lm_head.weight", (VOCAB, d), "emb"))

    def attn(p):
        return [(p + "self_attn.q_proj.weight", (2 * h * HEAD_DIM, d), "w"),
                (p + "self_attn.k_proj.weight", (kv * HEAD_DIM, d), "w"),
                (p + "self_attn.v_proj.weight", (kv * HEAD_DIM, d), "w"),
                (p + "self_attn.o_proj.weight", (d, h * HEAD_DIM), "w"),
                (p + "self_attn.q_norm.weight", (HEAD_DIM,), "norm"),
                (p + "self_attn.k_norm.weight", (HEAD_DIM,), "norm")]

    def common(p):
        return [(p + "input_layernorm.weight", (d,), "norm"),
                (p + "post_attention_layernorm.weight", (d,), "norm"),
                (p + "mlp.gate_proj.weight", (ff, d), "w"),
                (p + "mlp.up_proj.weight", (ff, d), "w"),
                (p + "mlp.down_proj.weight", (d, ff), "w")]

    for i in range(n_layer):
        p = f"model.language_model.layers.{i}."
        out += common(p)
        if (i + 1) % 4 == 0:
            out += attn(p)
        else:
            q = p + "linear_attn."
            out += [(q + "in_proj_qkv.weight", (conv_ch, d), "w"),
                    (q + "in_proj_z.weight", (hv * LIN_DIM, d), "w"),
                    (q + "in_proj_a.weight", (hv, d), "w"),
                    (q + "in_proj_b.weight", (hv, d), "w"),
                    (q + "A_log", (hv,), "alog"),
                    (q + "dt_bias", (hv,), "one"),
                    (q + "conv1d.weight", (conv_ch, 1, CONV), "w"),
                    (q + "norm.weight", (LIN_DIM,), "one"),
                    (q + "out_proj.weight", (d, hv * LIN_DIM), "w")]
    out += [("mtp.fc.weight", (d, 2 * d), "w"),
            ("mtp.pre_fc_norm_embedding.weight", (d,), "norm"),
            ("mtp.pre_fc_norm_hidden.weight", (d,), "norm"),
            ("mtp.norm.weight", (d,), "norm")]
    out += common("mtp.layers.0.") + attn("mtp.layers.0.")
    return out


def config(size):
    d, n_layer, ff, h, kv, hk, hv, tied = SIZES[size]
    text = {
        "architectures": None, "hidden_size": d, "num_hidden_layers": n_layer, "intermediate_size": ff,
        "num_attention_heads": h, "num_key_value_heads": kv, "head_dim": HEAD_DIM,
        "linear_num_key_heads": hk, "linear_num_value_heads": hv, "linear_key_head_dim": LIN_DIM,
        "linear_value_head_dim": LIN_DIM, "linear_conv_kernel_dim": CONV, "full_attention_interval": 4,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n_layer)],
        "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
        "mtp_num_hidden_layers": 1, "tie_word_embeddings": tied, "eos_token_id": 248044,
        "bos_token_id": 248044,
        "attn_output_gate": True, "hidden_act": "silu", "model_type": "qwen3_5_text",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    }
    del text["architectures"]
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "tie_word_embeddings": tied, "text_config": text,
            "vision_config": {"depth": 27, "hidden_size": 1152}}


def read_gguf_kv(path):
    """The metadata of a GGUF file (v2/v3) as a dict; tensors are not read."""
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
              12: "<d"}
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"GGUF":
        raise SystemExit(f"{path} is not a GGUF file")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise SystemExit(f"{path}: GGUF version {version} is not supported")
    pos = 24

    def string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        return data[pos - n:pos].decode("utf-8", "surrogateescape")

    def value(t):
        nonlocal pos
        if t == 8:
            return string()
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if et in scalar:
                fmt = scalar[et]
                size = struct.calcsize(fmt)
                out = list(struct.unpack_from(f"<{n}{fmt[1]}", data, pos))
                pos += n * size
                return out
            return [value(et) for _ in range(n)]
        fmt = scalar[t]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    kv = {}
    for _ in range(n_kv):
        key = string()
        (t,) = struct.unpack_from("<I", data, pos)
        pos += 4
        kv[key] = value(t)
    return kv


# The Qwen3.5 tokenizer.json sections around the vocabulary (NFC, its split regex, byte level).
QWEN35_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
                "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def tokenizer_from_gguf(path, out_dir):
    """Writes tokenizer.json / tokenizer_config.json equivalent to a vocab-only GGUF's tokenizer."""
    kv = read_gguf_kv(path)
    tokens = kv["tokenizer.ggml.tokens"]
    types = kv.get("tokenizer.ggml.token_type", [1] * len(tokens))
    vocab, added = {}, []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty == 1:  # NORMAL
            vocab[t] = i
        elif ty in (3, 4):  # CONTROL, USER_DEFINED
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": ty == 4, "special": ty == 3})
        # UNUSED ([PAD<id>]) entries are left out: the converter writes them back for ids < vocab_size.
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN35_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": kv.get("tokenizer.ggml.merges", [])},
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)

    def tok_name(key):
        i = kv.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if i is not None and i < len(tokens) else None

    cfg = {"add_bos_token": bool(kv.get("tokenizer.ggml.add_bos_token", False)), "add_prefix_space": False,
           "bos_token": None, "eos_token": tok_name("eos"), "pad_token": tok_name("padding"),
           "unk_token": None, "clean_up_tokenization_spaces": False, "errors": "replace",
           "model_max_length": 262144, "split_special_tokens": False, "tokenizer_class": "TokenizersBackend"}
    if "tokenizer.chat_template" in kv:
        cfg["chat_template"] = kv["tokenizer.chat_template"]
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    print(f"tokenizer: {len(vocab)} tokens, {len(added)} added, "
          f"{len(tok['model']['merges'])} merges from {path}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--size", default="9b", choices=SIZES)
    ap.add_argument("--shard-gb", type=float, default=5.0)
    tk = ap.add_mutually_exclusive_group()
    tk.add_argument("--tokenizer-from", help="copy tokenizer.json / tokenizer_config.json from this folder")
    tk.add_argument("--tokenizer-gguf", help="rebuild tokenizer.json / tokenizer_config.json from this GGUF")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vision", action="store_true",
                    help="add the vision tower (model.visual.*; sizes " + ", ".join(VISION) + ")")
    a = ap.parse_args()
    if a.vision and a.size not in VISION:
        ap.error(f"--vision: the vision tower of {a.size} is not known (sizes {', '.join(VISION)})")
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    # values; not a multiple of any row length, so rows reusing the pool are shifted, not identical
    pool_n = (32 << 20) + 4099
    normal = rng.standard_normal(pool_n, dtype=np.float32)
    small = normal[: 1 << 16]
    alog = np.log(rng.uniform(1, 16, 1 << 16).astype(np.float32))
    pools = {}

    def bf16(x):
        # round to nearest even
        u = x.astype(np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    def pool(kind, shape):
        if kind == "w":
            key = ("w", shape[-1])
        else:
            key = (kind,)
        if key not in pools:
            if kind == "w":
                pools[key] = bf16(normal * np.float32(1 / np.sqrt(shape[-1])))
            elif kind == "emb":
                pools[key] = bf16(normal * np.float32(0.02))
            elif kind == "norm":
                pools[key] = bf16(small * np.float32(0.1))
            elif kind == "one":
                pools[key] = bf16(1 + small * np.float32(0.1))
            elif kind == "alog":
                pools[key] = bf16(alog)
            elif kind == "conv":
                pools[key] = bf16(normal * np.float32(1 / np.sqrt(int(np.prod(shape[1:])))))
            elif kind == "pos":
                pools[key] = bf16(normal * np.float32(0.5))
            else:
                raise ValueError(kind)
        return pools[key]

    # Shards in the published layout: tensors in name order, cut every --shard-gb.
    ts = sorted(tensors(a.size) + (vision_tensors(a.size) if a.vision else []))
    shards, cur, cur_bytes = [], [], 0
    for t in ts:
        nbytes = int(np.prod(t[1])) * 2
        if cur and cur_bytes + nbytes > a.shard_gb * 1e9:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += nbytes
    shards.append(cur)
    weight_map, total, k = {}, 0, 0
    for si, shard in enumerate(shards):
        fname = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {}, 0
        for name, shape, _ in shard:
            n = int(np.prod(shape)) * 2
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(a.out, fname), "wb") as f:
            f.write(len(h).to_bytes(8, "little"))
            f.write(h)
            for name, shape, kind in shard:
                n = int(np.prod(shape))
                src = pool(kind, shape)
                start = (k * 7919) % len(src)
                k += 1
                while n > 0:
                    m = min(n, len(src) - start)
                    f.write(src[start:start + m].tobytes())
                    n -= m
                    start = 0
        total += off
        print(f"{fname}: {len(shard)} tensors, {off / 1e9:.2f} GB", flush=True)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    cfg = config(a.size)
    if a.vision:
        cfg["vision_config"] = vision_config(a.size)
        with open(os.path.join(a.out, "preprocessor_config.json"), "w") as f:
            json.dump(PREPROCESSOR, f, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if a.tokenizer_from:
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(a.tokenizer_from, fn), os.path.join(a.out, fn))
    elif a.tokenizer_gguf:
        tokenizer_from_gguf(a.tokenizer_gguf, a.out)
    print(f"{len(ts)} tensors, {total / 1e9:.2f} GB in {len(shards)} shards")


if __name__ == "__main__":
    main()
