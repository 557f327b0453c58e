#!/usr/bin/env python3
"""Builds tests/fixtures/iq/dequant-<TYPE>.bin: random blocks of the IQ2/IQ1 lattice formats and their
dequantization by the gguf package (bit-exact with ggml's dequantize_row_*), for the dequantizer tests.

Each file is N blocks of raw bytes followed by the N·256 dequantized values as little-endian f32. Block
bytes are uniform random except the f16 super-scale, which is set to a finite value (zero, negative,
tiny and large ones included) so the expected values are finite.

Needs: pip install gguf numpy.   Run: python3 tools/make_iq_dequant_vectors.py
"""
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

N = 16
SCALES = [0.0, 1.0, -0.5, 3.1e-5, 6.0e-8, 1234.0, 0.0123, -0.0071]
TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]

out = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "iq"
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(19)
for name in TYPES:
    qt = QT[name]
    _, size = GGML_QUANT_SIZES[qt]
    blocks = rng.integers(0, 256, size=(N, size), dtype=np.uint8)
    for i in range(N):
        d = SCALES[i] if i < len(SCALES) else float(rng.normal() * 0.01)
        h = int(np.array([d], dtype=np.float16).view(np.uint16)[0])
        if name == "IQ1_M":
            # The f16 scale's nibble k is the top nibble of the u16 scales[k] (bytes 48 + 2k, 49 + 2k).
            for k in range(4):
                b = 48 + 2 * k + 1
                blocks[i, b] = (blocks[i, b] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4)
        else:
            blocks[i, 0:2] = [h & 0xFF, h >> 8]
    values = dequantize(blocks, qt).astype("<f4").reshape(-1)
    assert np.all(np.isfinite(values))
    (out / f"dequant-{name}.bin").write_bytes(blocks.tobytes() + values.tobytes())
    print(name, blocks.nbytes + values.nbytes, "bytes")
