//! F32 / F16 / BF16 weight rows · f32 activations: 8 lanes of FMA per row × token pair, tiles of rows ×
//! tokens so each loaded weight vector serves several tokens.

use core::arch::x86_64::*;

use super::{hsum_ps, loadu128};
use crate::kernels::scalar;
use crate::kernels::FEW_TOKENS;
use crate::quant::GgmlType;

trait FloatFormat {
    const ES: usize;
    unsafe fn load8(p: *const u8) -> __m256;
    fn tail_dot(w: &[u8], a: &[f32]) -> f32;
}

struct F32;
impl FloatFormat for F32 {
    const ES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p as *const f32)
    }
    fn tail_dot(w: &[u8], a: &[f32]) -> f32 {
        scalar::dot_f32(w, a)
    }
}

struct F16;
impl FloatFormat for F16 {
    const ES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(loadu128(p))
    }
    fn tail_dot(w: &[u8], a: &[f32]) -> f32 {
        scalar::dot_f16(w, a)
    }
}

struct BF16;
impl FloatFormat for BF16 {
    const ES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(loadu128(p))))
    }
    fn tail_dot(w: &[u8], a: &[f32]) -> f32 {
        scalar::dot_bf16(w, a)
    }
}

/// `R` rows × `T` tokens over the first `n8` elements (a multiple of 8), plus the scalar tail.
#[inline(always)]
unsafe fn tile<F: FloatFormat, const R: usize, const T: usize>(
    w: [&[u8]; R],
    a: [&[f32]; T],
    n: usize,
) -> [[f32; T]; R] {
    let n8 = n / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut i = 0;
    while i < n8 {
        let mut x = [_mm256_setzero_ps(); R];
        for r in 0..R {
            x[r] = F::load8(w[r].as_ptr().add(i * F::ES));
        }
        for t in 0..T {
            let y = _mm256_loadu_ps(a[t].as_ptr().add(i));
            for r in 0..R {
                acc[r][t] = _mm256_fmadd_ps(x[r], y, acc[r][t]);
            }
        }
        i += 8;
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum_ps(acc[r][t]);
            if n8 < n {
                out[r][t] += F::tail_dot(&w[r][n8 * F::ES..], &a[t][n8..]);
            }
        }
    }
    out
}

#[inline(always)]
unsafe fn rows<F: FloatFormat, const RD: usize, const RP: usize, const TP: usize>(
    w: &[u8],
    a: &[f32],
    n_tok: usize,
    out: &mut [f32],
) {
    if n_tok == 0 || out.is_empty() {
        return;
    }
    let n_rows = out.len() / n_tok;
    let n = a.len() / n_tok;
    let rb = n * F::ES;
    assert!(
        n_rows * n_tok == out.len() && rb * n_rows == w.len() && n * n_tok == a.len(),
        "float_rows: weight/activation lengths do not match"
    );
    let wrow = |r: usize| &w[r * rb..(r + 1) * rb];
    let arow = |t: usize| &a[t * n..(t + 1) * n];
    if n_tok == 1 {
        let mut r = 0;
        while r + RD <= n_rows {
            let res = tile::<F, RD, 1>(core::array::from_fn(|i| wrow(r + i)), [arow(0)], n);
            for (i, v) in res.iter().enumerate() {
                out[r + i] = v[0];
            }
            r += RD;
        }
        while r < n_rows {
            out[r] = tile::<F, 1, 1>([wrow(r)], [arow(0)], n)[0][0];
            r += 1;
        }
        return;
    }
    match n_tok {
        2 => return few::<F, RP, 2>(w, a, n_rows, out),
        3 => return few::<F, RP, 3>(w, a, n_rows, out),
        4 => return few::<F, RP, 4>(w, a, n_rows, out),
        _ => {}
    }
    const { assert!(FEW_TOKENS == 4, "one `few` instance per few-token count") };
    let mut t = 0;
    while t < n_tok {
        let tt = TP.min(n_tok - t);
        let mut r = 0;
        while r < n_rows {
            let rr = RP.min(n_rows - r);
            if rr == RP && tt == TP {
                let res = tile::<F, RP, TP>(
                    core::array::from_fn(|i| wrow(r + i)),
                    core::array::from_fn(|j| arow(t + j)),
                    n,
                );
                for (i, row) in res.iter().enumerate() {
                    out[(r + i) * n_tok + t..][..TP].copy_from_slice(row);
                }
            } else {
                for i in 0..rr {
                    for j in 0..tt {
                        out[(r + i) * n_tok + t + j] =
                            tile::<F, 1, 1>([wrow(r + i)], [arow(t + j)], n)[0][0];
                    }
                }
            }
            r += rr;
        }
        t += tt;
    }
}

/// `T` ≤ [`FEW_TOKENS`] tokens (speculative decoding's verification): tiles of `R` rows × all `T` tokens,
/// so each weight row is read once (the prefill tile's `R`, whose accumulators fit the registers).
///
/// # Safety
/// As [`rows`], which checked the lengths (`out` is `[n_rows × T]`).
#[inline(always)]
unsafe fn few<F: FloatFormat, const R: usize, const T: usize>(
    w: &[u8],
    a: &[f32],
    n_rows: usize,
    out: &mut [f32],
) {
    let n = a.len() / T;
    let rb = n * F::ES;
    let wrow = |r: usize| &w[r * rb..(r + 1) * rb];
    let arows: [&[f32]; T] = core::array::from_fn(|t| &a[t * n..(t + 1) * n]);
    let mut r = 0;
    while r + R <= n_rows {
        let res = tile::<F, R, T>(core::array::from_fn(|i| wrow(r + i)), arows, n);
        for (i, v) in res.iter().enumerate() {
            out[(r + i) * T..][..T].copy_from_slice(v);
        }
        r += R;
    }
    for r in r..n_rows {
        let res = tile::<F, 1, T>([wrow(r)], arows, n);
        out[r * T..][..T].copy_from_slice(&res[0]);
    }
}

/// Float weight rows · f32 activation rows, tiles of `RD` rows (decode), `RP` × all tokens (2 to
/// [`FEW_TOKENS`], see [`few`]) and `RP` × `TP` (prefill). Each (row, token) gets the same float
/// operations whatever the tile.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (the caller's target features).
#[inline(always)]
pub(crate) unsafe fn float_rows<const RD: usize, const RP: usize, const TP: usize>(
    ty: GgmlType,
    w: &[u8],
    a: &[f32],
    n_tok: usize,
    out: &mut [f32],
) {
    match ty {
        GgmlType::F32 => rows::<F32, RD, RP, TP>(w, a, n_tok, out),
        GgmlType::F16 => rows::<F16, RD, RP, TP>(w, a, n_tok, out),
        GgmlType::BF16 => rows::<BF16, RD, RP, TP>(w, a, n_tok, out),
        other => panic!("float_rows called with {other}"),
    }
}
