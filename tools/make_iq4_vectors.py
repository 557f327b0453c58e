#!/usr/bin/env python3
"""Builds tests/fixtures/iq4-vectors.gguf and the no-imatrix digests of llama-quantize for IQ4_NL/IQ4_XS.

1. Dequantization: `rand:<T>` holds random blocks (random codes, random finite f16/E8M0 scales) of IQ4_NL,
   IQ4_XS, TQ1_0, TQ2_0 and MXFP4; key `sha256.rand:<T>` is the sha256 of their dequantization by the
   `gguf` package.
2. Quantization: `src` holds F32 rows (rows of tiny-r2 and synthetic rows: scales from 1e-20 to 1e3,
   outliers, zero sub-blocks and super-blocks, never a zero first block: ggml's IQ4_NL `_ref` leaves
   that block's codes uninitialized), `qw` random importance weights of one row. `ref:<T>` is ggml's
   `quantize_row_<t>_ref` on each row (tools/iq4_ref.c, linked against llama.cpp's libggml-base.a);
   `noimx:<T>` and `imx:<T>` are `quantize_iq4_nl`/`quantize_iq4_xs` (llama-quantize's row quantizer)
   without and with `qw`. For TQ1_0, TQ2_0 and MXFP4 the script also checks that the gguf package's
   quantizer gives the same bytes as ggml's.
3. tests/fixtures/imatrix/quant/noimatrix-pure-IQ4_{NL,XS}.tsv: per tensor of `llama-quantize --pure`
   (no imatrix) on tiny-r2-F32, name, type, sha256 of the data and sha256 of the gguf package's
   dequantization (f32, little-endian) of it.

Run: python3 tools/make_iq4_vectors.py LLAMA_BUILD_DIR   (needs bin/llama-quantize and
ggml/src/libggml-base.a there, a C compiler with OpenMP, pip install gguf numpy)
"""
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as QT

root = Path(__file__).resolve().parents[1]
build = Path(sys.argv[1])
out = root / "tests" / "fixtures" / "iq4-vectors.gguf"
r2 = root / "tests" / "fixtures" / "shared" / "tiny-r2" / "tiny-r2-F32.gguf"
rng = np.random.default_rng(19)
N = 512
TYPES = [QT.IQ4_NL, QT.IQ4_XS, QT.TQ1_0, QT.TQ2_0, QT.MXFP4]

tmp = Path(tempfile.mkdtemp())
helper = tmp / "iq4_ref"
subprocess.run(["cc", "-O2", "-fopenmp", str(root / "tools" / "iq4_ref.c"),
                str(build / "ggml" / "src" / "libggml-base.a"), "-lm", "-lpthread", "-lstdc++",
                "-o", str(helper)], check=True)


def ggml(mode: str, t: QT, x: np.ndarray, qw=None) -> np.ndarray:
    data = x.astype("<f4").tobytes() + (b"" if qw is None else qw.astype("<f4").tobytes())
    res = subprocess.run([str(helper), mode, t.name.lower(), str(x.shape[0]), str(x.shape[1])],
                         input=data, capture_output=True, check=True)
    return np.frombuffer(res.stdout, dtype=np.uint8).reshape(x.shape[0], -1)


def source_rows() -> np.ndarray:
    f = GGUFReader(str(r2))
    real = [np.asarray(f.get_tensor(i).data).reshape(-1)[: 2 * N] for i, t in enumerate(f.tensors)
            if t.name in ("blk.0.ffn_up.weight", "blk.3.attn_q.weight", "token_embd.weight")]
    rows = [r.reshape(2, N) for r in real]
    g = lambda s: (rng.standard_normal(N) * s).astype(np.float32)
    synth = [g(1e-3), g(1.0), g(1e3), rng.standard_t(2, N).astype(np.float32)]
    z = g(1.0); z[96:128] = 0; z[256:] = 0                 # a zero sub-block, a zero super-block
    synth.append(z)
    t = g(1.0); t[32:64] = g(1e-20)[:32]; t[300:400] = g(1e-17)[:100]   # below GROUP_MAX_EPS
    synth.append(t)
    o = g(0.01); o[::37] = 5.0; o[5::41] = -7.0             # outliers
    synth.append(o)
    u = rng.uniform(-1, 1, N).astype(np.float32); u[::32] = 1.0   # ties on the block maximum
    synth.append(u)
    return np.concatenate(rows + [np.stack(synth)]).astype(np.float32)


def random_blocks(t: QT, n: int) -> np.ndarray:
    size = gguf.GGML_QUANT_SIZES[t][1]
    b = rng.integers(0, 256, (n, size), dtype=np.uint8)
    d = (rng.standard_normal(n) * 0.05).astype(np.float16).view(np.uint8).reshape(n, 2)
    if t in (QT.IQ4_NL, QT.IQ4_XS):
        b[:, :2] = d
    elif t in (QT.TQ1_0, QT.TQ2_0):
        b[:, -2:] = d
    return b  # MXFP4: any E8M0 byte is a valid scale


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


w = GGUFWriter(str(out), "deltaq-iq4-vectors")
for t in TYPES:
    blocks = random_blocks(t, 64)
    name = f"rand:{t.name}"
    w.add_string("sha256." + name, sha(gguf.quants.dequantize(blocks, t).astype("<f4")))
    w.add_tensor(name, blocks, raw_dtype=t)

src = source_rows()
qw = rng.uniform(0, 3, N).astype(np.float32) ** 2
w.add_tensor("src", src, raw_dtype=QT.F32)
w.add_tensor("qw", qw.reshape(1, N), raw_dtype=QT.F32)
for t in TYPES:
    ref = ggml("ref", t, src)
    if t in (QT.TQ1_0, QT.TQ2_0, QT.MXFP4):
        py = gguf.quants.quantize(src, t)
        assert np.array_equal(py, ref), f"{t.name}: gguf package and ggml quantizers differ"
    w.add_tensor(f"ref:{t.name}", ref, raw_dtype=t)
    if t in (QT.IQ4_NL, QT.IQ4_XS):
        w.add_tensor(f"noimx:{t.name}", ggml("noimx", t, src), raw_dtype=t)
        w.add_tensor(f"imx:{t.name}", ggml("imx", t, src, qw), raw_dtype=t)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"wrote {out.relative_to(root)} ({out.stat().st_size} bytes)")

for t in ("IQ4_NL", "IQ4_XS"):
    q = tmp / f"{t}.gguf"
    subprocess.run([str(build / "bin" / "llama-quantize"), "--pure", str(r2), str(q), t, "2"],
                   check=True, capture_output=True)
    tsv = root / "tests" / "fixtures" / "imatrix" / "quant" / f"noimatrix-pure-{t}.tsv"
    with open(tsv, "w") as f:
        for tensor in GGUFReader(str(q)).tensors:
            raw = np.asarray(tensor.data)
            deq = gguf.quants.dequantize(raw, tensor.tensor_type).astype("<f4")
            f.write(f"{tensor.name}\t{tensor.tensor_type.name}\t{sha(raw)}\t{sha(deq)}\n")
    print(f"wrote {tsv.relative_to(root)}")
