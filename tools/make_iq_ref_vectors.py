#!/usr/bin/env python3
"""Builds tests/fixtures/iq/ref-<TYPE>.bin: ggml's quantizer without an importance matrix on a few rows,
for the formats whose weightless path ggml reaches (IQ2_S: quantize_row_iq2_s_ref; IQ1_M: quantize_iq1_m
with no weights, which ggml_quantize_chunk allows). Each file is the 4 × 512 input floats (LE f32) followed
by ggml_quantize_chunk's output bytes.

Compiles a small C harness against llama.cpp's static libggml-base.a.
Run: python3 tools/make_iq_ref_vectors.py LLAMA_CPP_SOURCE_DIR LLAMA_BUILD_DIR
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "ggml.h"
int main(int argc, char **argv) {
    int type = atoi(argv[1]), n_rows = atoi(argv[2]), n = atoi(argv[3]);
    float *x = malloc(sizeof(float) * n_rows * n);
    if (fread(x, sizeof(float), n_rows * n, stdin) != (size_t)(n_rows * n)) return 1;
    ggml_quantize_init(type);
    void *out = malloc(ggml_row_size(type, n) * n_rows);
    size_t w = ggml_quantize_chunk(type, x, out, 0, n_rows, n, NULL);
    fwrite(out, 1, w, stdout);
    return 0;
}
"""

src, build = Path(sys.argv[1]), Path(sys.argv[2])
out = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "iq"
with tempfile.TemporaryDirectory() as tmp:
    c, exe = Path(tmp) / "ref.c", Path(tmp) / "ref"
    c.write_text(HARNESS)
    subprocess.run(["gcc", "-O2", f"-I{src / 'ggml' / 'include'}", str(c),
                    str(build / "ggml" / "src" / "libggml-base.a"),
                    "-lm", "-lpthread", "-lstdc++", "-fopenmp", "-o", str(exe)], check=True)
    rng = np.random.default_rng(2019)
    rows, n = 4, 512
    x = (rng.standard_normal((rows, n)) * rng.choice([0.01, 0.1, 1.0], size=(rows, 1))).astype(np.float32)
    x[1, 256:272] = 0  # an all-zero group
    x[2, ::37] *= 8  # outliers
    x[3, :16] = 1e-9  # a group below IQ2_S's epsilon
    for name, ty in [("IQ2_S", 22), ("IQ1_M", 29)]:
        r = subprocess.run([str(exe), str(ty), str(rows), str(n)], input=x.tobytes(),
                           capture_output=True, check=True)
        (out / f"ref-{name}.bin").write_bytes(x.astype("<f4").tobytes() + r.stdout)
        print(name, len(r.stdout), "bytes")
