// ggml's reference quantizers for tools/make_iq4_vectors.py, linked against llama.cpp's libggml-base.a.
//   iq4_ref MODE TYPE NROW NPERROW < rows.f32 [weights.f32] > blocks
// MODE: ref (quantize_row_<type>_ref per row), imx (quantize_<type> with the NPERROW weights read after
// the rows), noimx (quantize_<type> without weights). TYPE: iq4_nl iq4_xs tq1_0 tq2_0 mxfp4.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void quantize_row_iq4_nl_ref(const float *, void *, int64_t);
void quantize_row_iq4_xs_ref(const float *, void *, int64_t);
void quantize_row_tq1_0_ref(const float *, void *, int64_t);
void quantize_row_tq2_0_ref(const float *, void *, int64_t);
void quantize_row_mxfp4_ref(const float *, void *, int64_t);
size_t quantize_iq4_nl(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_iq4_xs(const float *, void *, int64_t, int64_t, const float *);

struct fmt {
    const char * name;
    int block, size;
    void (*ref)(const float *, void *, int64_t);
    size_t (*full)(const float *, void *, int64_t, int64_t, const float *);
};

static const struct fmt fmts[] = {
    {"iq4_nl", 32, 18, quantize_row_iq4_nl_ref, quantize_iq4_nl},
    {"iq4_xs", 256, 136, quantize_row_iq4_xs_ref, quantize_iq4_xs},
    {"tq1_0", 256, 54, quantize_row_tq1_0_ref, NULL},
    {"tq2_0", 256, 66, quantize_row_tq2_0_ref, NULL},
    {"mxfp4", 32, 17, quantize_row_mxfp4_ref, NULL},
};

static float * read_floats(size_t n) {
    float * p = malloc(n * sizeof(float));
    if (fread(p, sizeof(float), n, stdin) != n) { fprintf(stderr, "short input\n"); exit(1); }
    return p;
}

int main(int argc, char ** argv) {
    if (argc != 5) { fprintf(stderr, "usage: iq4_ref MODE TYPE NROW NPERROW\n"); return 1; }
    const struct fmt * f = NULL;
    for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++) {
        if (!strcmp(fmts[i].name, argv[2])) f = &fmts[i];
    }
    if (!f) { fprintf(stderr, "unknown type %s\n", argv[2]); return 1; }
    int64_t nrow = atoll(argv[3]), n = atoll(argv[4]);
    float * x = read_floats(nrow * n);
    size_t row_bytes = n / f->block * f->size;
    unsigned char * out = calloc(nrow, row_bytes);
    if (!strcmp(argv[1], "ref")) {
        for (int64_t r = 0; r < nrow; r++) f->ref(x + r * n, out + r * row_bytes, n);
    } else if (f->full && (!strcmp(argv[1], "imx") || !strcmp(argv[1], "noimx"))) {
        float * qw = !strcmp(argv[1], "imx") ? read_floats(n) : NULL;
        f->full(x, out, nrow, n, qw);
    } else {
        fprintf(stderr, "bad mode %s for %s\n", argv[1], argv[2]);
        return 1;
    }
    fwrite(out, 1, nrow * row_bytes, stdout);
    return 0;
}
