#!/usr/bin/env python3
"""Writes a random BF16 Qwen3.5 checkpoint with the real tensor names and shapes, sharded like the
published ones (Qwen3_5ForConditionalGeneration naming, model.safetensors.index.json, MTP block), to
measure `deltaq convert` on full-size models without downloading one.

    tools/make_fake_checkpoint.py OUT_DIR [--size 9b|4b|2b|0.8b] [--shard-gb 5] [--tokenizer-from HF_DIR]

Only numpy is needed. Values are N(0, 0.02) (norms: N(0, 0.1); A_log: log U(1, 16)), drawn once into a
pool that the tensors reuse at varying offsets, so writing is disk-bound. Put the output outside the
repository (it is ~19 GB for 9b).
"""
import argparse
import json
import os
import shutil

import numpy as np

SIZES = {
    # hidden, layers, ffn, heads, kv heads, linear key heads, linear value heads, tied
    "0.8b": (1024, 24, 3584, 8, 2, 16, 16, True),
    "2b": (2048, 24, 6144, 8, 2, 16, 16, True),
    "4b": (2560, 32, 9216, 16, 4, 16, 32, True),
    "9b": (4096, 32, 12288, 16, 4, 16, 32, False),
}
VOCAB, HEAD_DIM, LIN_DIM, CONV = 248320, 256, 128, 4


def tensors(size):
    d, n_layer, ff, h, kv, hk, hv, tied = SIZES[size]
    conv_ch = 2 * hk * LIN_DIM + hv * LIN_DIM
    out = [("model.language_model.embed_tokens.weight", (VOCAB, d), "w"),
           ("model.language_model.norm.weight", (d,), "norm")]
    if not tied:
        out.append(("lm_head.weight", (VOCAB, d), "w"))

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
                    (q + "dt_bias", (hv,), "norm"),
                    (q + "conv1d.weight", (conv_ch, 1, CONV), "w"),
                    (q + "norm.weight", (LIN_DIM,), "norm"),
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
        "attn_output_gate": True, "hidden_act": "silu", "model_type": "qwen3_5_text",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    }
    del text["architectures"]
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "tie_word_embeddings": tied, "text_config": text,
            "vision_config": {"depth": 27, "hidden_size": 1152}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--size", default="9b", choices=SIZES)
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--tokenizer-from", help="copy tokenizer.json / tokenizer_config.json from this folder")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(0)
    pool_n = 64 << 20  # bf16 values
    pool = {
        "w": (rng.standard_normal(pool_n, dtype=np.float32) * 0.02).view(np.uint32) >> 16,
        "norm": (rng.standard_normal(1 << 16, dtype=np.float32) * 0.1).view(np.uint32) >> 16,
        "alog": np.log(rng.uniform(1, 16, 1 << 16).astype(np.float32)).view(np.uint32) >> 16,
    }
    pool = {k: v.astype(np.uint16) for k, v in pool.items()}
    # Shards in the published layout: tensors in name order, cut every --shard-gb.
    ts = sorted(tensors(a.size))
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
                src = pool[kind]
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
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(a.size), f, indent=2)
    if a.tokenizer_from:
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(a.tokenizer_from, fn), os.path.join(a.out, fn))
    print(f"{len(ts)} tensors, {total / 1e9:.2f} GB in {len(shards)} shards")


if __name__ == "__main__":
    main()
