#!/usr/bin/env python3
"""Builds tests/fixtures/quant-vectors.gguf: small quantization test vectors cut from llama-quantize's output.

Source: ../shared/fixtures/tiny-r2 (tiny-r2-F32.gguf and the 14 llama-quantize files in quant/, made without
an importance matrix). Quantized blocks never span rows and depend only on their own inputs, so a subset of
rows is a valid test vector. For every quant file we keep the whole ssm_alpha/ssm_beta tensors of each layer
and the first ROWS rows of a few larger tensors, as `<file tag>:<tensor>` with the file's own type, plus the
F32 source rows as `src:<tensor>`. The metadata key `sha256.<name>` holds the sha256 of the dequantization by
the gguf package (llama.cpp's own reader/dequantizer; the fixture README records it is bit-identical to
ggml's to_float for every tensor of these files).

Needs: pip install gguf numpy.   Run: python3 tools/make_quant_vectors.py [SHARED_FIXTURES_DIR]
"""
import hashlib
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as QT

ROWS = 8
BIG = ["token_embd.weight", "blk.0.attn_qkv.weight", "blk.3.attn_q.weight", "blk.7.ffn_down.weight"]

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures")
r2 = root / "tiny-r2"
out = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "quant-vectors.gguf"


def wanted(name: str) -> bool:
    return name.endswith(("ssm_alpha.weight", "ssm_beta.weight")) or name in BIG


def rows_of(t) -> np.ndarray:
    """Raw bytes of the kept rows, as a 2-D uint8 array [rows, row_bytes]."""
    data = np.asarray(t.data)
    raw = data.view(np.uint8).reshape(int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1, -1)
    return raw if t.name not in BIG else raw[:ROWS]


w = GGUFWriter(str(out), "deltaq-quant-vectors")
src = GGUFReader(str(r2 / "tiny-r2-F32.gguf"))
for t in src.tensors:
    if wanted(t.name):
        raw = rows_of(t)
        w.add_tensor("src:" + t.name, raw.view(np.float32), raw_dtype=QT.F32)

for path in sorted((r2 / "quant").glob("*.gguf")):
    tag = path.stem.removeprefix("tiny-r2-")
    for t in GGUFReader(str(path)).tensors:
        if not wanted(t.name) or t.tensor_type == QT.F32:
            continue
        raw = np.ascontiguousarray(rows_of(t))
        name = f"{tag}:{t.name}"
        deq = gguf.quants.dequantize(raw, t.tensor_type).astype("<f4")
        w.add_string("sha256." + name, hashlib.sha256(deq.tobytes()).hexdigest())
        w.add_tensor(name, raw, raw_dtype=t.tensor_type)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"wrote {out} ({out.stat().st_size} bytes)")
