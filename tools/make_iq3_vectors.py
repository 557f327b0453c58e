#!/usr/bin/env python3
"""Builds tests/fixtures/iq3-dequant.gguf: dequantization test vectors for IQ3_XXS and IQ3_S.

For each type, 32 pseudo-random blocks (every code, sign and scale byte uniform, so every grid point, sign
pattern and 4-bit scale occurs) whose f16 super-scales cover zero, subnormals, both signs and large
magnitudes. The metadata key `sha256.<type>` holds the sha256 of their dequantization (little-endian f32)
by the `gguf` Python package, whose dequantizers follow ggml's `dequantize_row_iq3_*` operation by
operation.

Needs: pip install gguf numpy.   Run: python3 tools/make_iq3_vectors.py
"""
import hashlib
from pathlib import Path

import numpy as np
import gguf
from gguf import GGUFWriter, GGMLQuantizationType as QT

BLOCKS = 32
out = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "iq3-dequant.gguf"
rng = np.random.default_rng(20261127)
# Super-scales: zero, ± subnormal, ordinary, large (finite f16 bit patterns only).
scales = np.array([0.0, -0.0, 3e-7, -5.9e-8, 1e-3, -2.5e-2, 0.5, -1.0, 7.25, -300.0, 65504.0, -65504.0],
                  dtype=np.float16)

w = GGUFWriter(str(out), "deltaq-iq3-vectors")
for qt in (QT.IQ3_XXS, QT.IQ3_S):
    size = gguf.GGML_QUANT_SIZES[qt][1]
    raw = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
    d = np.concatenate([scales, rng.normal(0, 0.05, BLOCKS - len(scales)).astype(np.float16)])
    raw[:, 0:2] = d.view(np.uint8).reshape(BLOCKS, 2)
    raw = raw.reshape(1, -1)
    deq = gguf.quants.dequantize(raw, qt).astype("<f4")
    assert deq.size == BLOCKS * 256 and np.isfinite(deq).all()
    w.add_string("sha256." + qt.name, hashlib.sha256(deq.tobytes()).hexdigest())
    w.add_tensor(qt.name, raw, raw_dtype=qt)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"wrote {out} ({out.stat().st_size} bytes)")
