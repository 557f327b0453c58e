#!/usr/bin/env python3
"""Builds tests/fixtures/rope-scaling.json: RoPE with llama.cpp's frequency scaling (none, linear, YaRN),
computed independently of deltaq in float64 numpy, for tests/rope_scaling.rs.

Each case gives a file's rope.scaling keys and llama.cpp's flags, the parameters llama.cpp resolves from them
(llama_context's constructor: yarn_ext_factor -1 -> 1 with YaRN, the YaRN magnitude boost cancelled in
yarn_attn_factor because ggml applies it, freq_scale 1 for `none`), and one head vector rotated at several
positions the way ggml's CPU rope does (rope_yarn, ggml_rope_yarn_corr_dims; NEOX pairs (i, i + n_rot/2) over
the first n_rot dims; the ramp in float32 as ggml's; interleaved M-RoPE: pair i takes the h position when i % 3 == 1 and i < 3*sections[1],
w when i % 3 == 2 and i < 3*sections[2], else t).

Needs: numpy.   Run: python3 tools/make_rope_fixture.py
"""
import json
import math
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "rope-scaling.json"
HEAD = 72  # 64 rotated dims and 8 left alone
F32 = np.float32


def resolve(n_rot, base, n_ctx_train, file, flags):
    kind = flags.get("scaling", file.get("type", "linear"))
    factor = file.get("factor", 0.0)
    # llama.cpp keeps freq_scale as a float32.
    freq_scale = 1.0 / flags["scale"] if "scale" in flags else (1.0 if factor == 0 else 1.0 / factor)
    freq_scale = 1.0 if kind == "none" else float(F32(freq_scale))
    base = flags.get("freq_base", base)
    n_ctx_orig = flags.get("yarn_orig_ctx") or file.get("orig_ctx") or n_ctx_train
    ext = flags.get("yarn_ext_factor", -1.0)
    if ext < 0:
        ext = 1.0 if kind == "yarn" else 0.0
    attn = 1.0
    if ext != 0:
        # llama.cpp does this arithmetic in float32.
        fac = F32(1.0) / F32(freq_scale)
        mscale = F32(1.0) if fac <= 1 else F32(0.1) * F32(math.log(fac)) + F32(1.0)
        attn = mscale * (F32(1.0) / (F32(1.0) + F32(0.1) * F32(math.log(fac))))
    attn = F32(attn) * F32(file.get("attn_factor", 1.0))
    return dict(kind=kind, freq_base=base, freq_scale=freq_scale, n_ctx_orig=n_ctx_orig, ext_factor=ext,
                attn_factor=float(attn), beta_fast=flags.get("yarn_beta_fast", 32.0),
                beta_slow=flags.get("yarn_beta_slow", 1.0))


def corr_dims(n_rot, r):
    def dim(beta):
        return n_rot * math.log(r["n_ctx_orig"] / (beta * 2 * math.pi)) / (2 * math.log(r["freq_base"]))
    return max(0.0, math.floor(dim(r["beta_fast"]))), min(n_rot - 1.0, math.ceil(dim(r["beta_slow"])))


def axis(sections, i):
    if sections and i % 3 == 1 and i < 3 * sections[1]:
        return 1
    if sections and i % 3 == 2 and i < 3 * sections[2]:
        return 2
    return 0


def rotate(x, pos, n_rot, sections, r):
    lo, hi = corr_dims(n_rot, r)
    half = n_rot // 2
    y = x.astype(np.float64).copy()
    mscale = r["attn_factor"]
    if r["ext_factor"] != 0:
        mscale *= 1 + 0.1 * math.log(1 / r["freq_scale"])
    for i in range(half):
        extrap = pos[axis(sections, i)] * r["freq_base"] ** (-2.0 * i / n_rot)
        theta = r["freq_scale"] * extrap
        if r["ext_factor"] != 0:
            # ggml's rope_yarn_ramp, in float32 as ggml computes it.
            frac = (F32(i) - F32(lo)) / F32(max(0.001, hi - lo))
            ramp = float(F32(1) - min(F32(1), max(F32(0), frac)))
            mix = ramp * r["ext_factor"]
            theta = theta * (1 - mix) + extrap * mix
        c, s = math.cos(theta) * mscale, math.sin(theta) * mscale
        a, b = float(x[i]), float(x[i + half])
        y[i], y[i + half] = a * c - b * s, a * s + b * c
    return y


CASES = [
    # Qwen3.5's shape, YaRN 4x over its 262144-token training context (the model cards' 1M recipe).
    dict(name="qwen35 yarn x4", n_rot=64, base=1e7, n_ctx_train=262144, file={},
         flags=dict(scaling="yarn", scale=4.0), positions=[[0, 0, 0], [1, 1, 1], [300000, 300000, 300000],
                                                            [1000000, 1000000, 1000000]]),
    # A small base so that the ramp falls mid-way, image (t, h, w) positions, a file attn_factor.
    dict(name="yarn mrope ramp", n_rot=64, base=1e4, n_ctx_train=4096,
         file=dict(type="yarn", factor=8.0, orig_ctx=2048, attn_factor=0.9), flags={},
         positions=[[5000, 17, 3], [40, 41, 42]]),
    # Flags over a YaRN file: another factor, half extrapolation, other betas, another base.
    dict(name="yarn flags", n_rot=64, base=1e7, n_ctx_train=32768, file=dict(type="yarn", factor=2.0),
         flags=dict(scale=3.0, yarn_ext_factor=0.5, yarn_beta_fast=16.0, yarn_beta_slow=2.0, freq_base=5e5,
                    yarn_orig_ctx=8192), positions=[[70000, 70000, 70000]]),
    dict(name="linear x4", n_rot=64, base=1e7, n_ctx_train=8192, file={}, flags=dict(scale=4.0),
         positions=[[20000, 20000, 20000]]),
    dict(name="none over a yarn file", n_rot=64, base=1e7, n_ctx_train=8192,
         file=dict(type="yarn", factor=4.0), flags=dict(scaling="none"), positions=[[123, 123, 123]]),
]


def main():
    rng = np.random.default_rng(20)
    sections = [11, 11, 10, 0]
    out = []
    for c in CASES:
        r = resolve(c["n_rot"], c["base"], c["n_ctx_train"], c["file"], c["flags"])
        x = rng.uniform(-1, 1, HEAD).astype(np.float32)
        rows = []
        for p in c["positions"]:
            y = rotate(x, p, c["n_rot"], sections, r)
            rows.append(dict(pos=p, y=[float(v) for v in y]))
        out.append(dict(name=c["name"], n_rot=c["n_rot"], base=c["base"], n_ctx_train=c["n_ctx_train"],
                        sections=sections, file=c["file"], flags=c["flags"], resolved=r,
                        corr_dims=list(corr_dims(c["n_rot"], r)), x=[float(v) for v in x], rows=rows))
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT} ({len(out)} cases)")


if __name__ == "__main__":
    main()
