//! Attention over the KV cache for the AVX-512 table: [`attend::body_grouped`] with 16-lane score and
//! value tiles (32 registers: 4 queries × 4 rows of scores at a time), f16 rows widened by
//! `vcvtph2ps zmm` (exact). The weights are the AVX2 entries' ([`super::attend::weights`]). Heads
//! that are not a multiple of 16 long take the AVX2 entries.

use core::arch::x86_64::*;

use half::f16;

use super::attend::{weights, Row};
use crate::kernels::attend::{self, KvPages, BLOCK};

/// A KV element type: 16 consecutive elements as 16 f32 lanes.
pub(crate) trait Row16: Row {
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Row16 for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl Row16 for f16 {
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
}

/// The sum of 16 lanes: halves added down to one lane (a fixed order).
#[inline(always)]
unsafe fn hsum16(v: __m512) -> f32 {
    let s = _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    );
    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn run<T: Row16>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: &mut [f32],
) {
    attend::body_grouped(
        qs,
        n_ctx,
        kv,
        scale,
        out,
        // SAFETY (all three): compiled with this function's features, which the caller guarantees;
        // each checks that the rows it reads are inside its slices.
        |q, k, stride, s, r| unsafe { scores(q, k, stride, s, r) },
        |s, max| unsafe { weights(s, max) },
        |o, w, v, stride, r| unsafe { values(o, w, v, stride, r) },
    )
}

/// Raw scores of a group of 1 to 4 queries against key rows `0..r`: one 16-lane accumulator per
/// (query, row) over the head and [`hsum16`], whatever the group size. Tiles of 4 × 4, 3 × 4, 2 × 8 and
/// 1 × 8 (query, row) pairs, then rows one at a time.
#[inline(always)]
unsafe fn scores<T: Row16>(qs: &[f32], k: &[T], stride: usize, s: &mut [[f32; BLOCK]], r: usize) {
    match s.len() {
        4 => scores_n::<T, 4, 4>(qs, k, stride, s, r),
        3 => scores_n::<T, 3, 4>(qs, k, stride, s, r),
        2 => scores_n::<T, 2, 8>(qs, k, stride, s, r),
        _ => scores_n::<T, 1, 8>(qs, k, stride, s, r),
    }
}

#[inline(always)]
unsafe fn scores_n<T: Row16, const G: usize, const R: usize>(
    qs: &[f32],
    k: &[T],
    stride: usize,
    s: &mut [[f32; BLOCK]],
    r: usize,
) {
    let hd = qs.len() / G;
    assert!(
        s.len() == G && r <= BLOCK && hd.is_multiple_of(16) && r > 0,
        "scores: shapes"
    );
    assert!(k.len() >= (r - 1) * stride + hd, "scores: rows outside k");
    let (qp, kp) = (qs.as_ptr(), k.as_ptr());
    // Every load is at `c..c + 16` < hd of query `j < G` or of key row `< r` (checked above).
    let mut i = 0;
    while i + R <= r {
        let mut acc = [[_mm512_setzero_ps(); R]; G];
        let mut c = 0;
        while c < hd {
            let mut kr = [_mm512_setzero_ps(); R];
            for (t, kr) in kr.iter_mut().enumerate() {
                *kr = T::load16(kp.add((i + t) * stride + c));
            }
            for (j, acc) in acc.iter_mut().enumerate() {
                let q = _mm512_loadu_ps(qp.add(j * hd + c));
                for (a, &kr) in acc.iter_mut().zip(&kr) {
                    *a = _mm512_fmadd_ps(q, kr, *a);
                }
            }
            c += 16;
        }
        for (s, acc) in s.iter_mut().zip(&acc) {
            for (t, &a) in acc.iter().enumerate() {
                s[i + t] = hsum16(a);
            }
        }
        i += R;
    }
    while i < r {
        let mut acc = [_mm512_setzero_ps(); G];
        let mut c = 0;
        while c < hd {
            let kr = T::load16(kp.add(i * stride + c));
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(j * hd + c)), kr, *a);
            }
            c += 16;
        }
        for (s, &a) in s.iter_mut().zip(&acc) {
            s[i] = hsum16(a);
        }
        i += 1;
    }
}

/// `out_j ← out_j + Σ_{i<r} w[j][i]·v_i` for a group of 1 to 4 queries (outputs consecutive in `out`):
/// 32 elements of every output in registers while each value row is loaded once for the group; one FMA
/// per element and row, in row order.
#[inline(always)]
unsafe fn values<T: Row16>(out: &mut [f32], w: &[[f32; BLOCK]], v: &[T], stride: usize, r: usize) {
    match w.len() {
        4 => values_n::<T, 4>(out, w, v, stride, r),
        3 => values_n::<T, 3>(out, w, v, stride, r),
        2 => values_n::<T, 2>(out, w, v, stride, r),
        _ => values_n::<T, 1>(out, w, v, stride, r),
    }
}

#[inline(always)]
unsafe fn values_n<T: Row16, const G: usize>(
    out: &mut [f32],
    w: &[[f32; BLOCK]],
    v: &[T],
    stride: usize,
    r: usize,
) {
    let hd = out.len() / G;
    assert!(
        w.len() == G && r <= BLOCK && hd.is_multiple_of(16) && r > 0,
        "values: shapes"
    );
    assert!(v.len() >= (r - 1) * stride + hd, "values: rows outside v");
    let (op, vp) = (out.as_mut_ptr(), v.as_ptr());
    // Every access is at `c..c + 32` (or `c..c + 16`) < hd of output `j < G` or of value row `< r`.
    let mut c = 0;
    while c + 32 <= hd {
        let mut acc = [[_mm512_setzero_ps(); 2]; G];
        for (j, a) in acc.iter_mut().enumerate() {
            a[0] = _mm512_loadu_ps(op.add(j * hd + c));
            a[1] = _mm512_loadu_ps(op.add(j * hd + c + 16));
        }
        for i in 0..r {
            let row = vp.add(i * stride + c);
            let (v0, v1) = (T::load16(row), T::load16(row.add(16)));
            for (a, w) in acc.iter_mut().zip(w) {
                let wi = _mm512_set1_ps(w[i]);
                a[0] = _mm512_fmadd_ps(wi, v0, a[0]);
                a[1] = _mm512_fmadd_ps(wi, v1, a[1]);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(op.add(j * hd + c), a[0]);
            _mm512_storeu_ps(op.add(j * hd + c + 16), a[1]);
        }
        c += 32;
    }
    if c < hd {
        let mut acc = [_mm512_setzero_ps(); G];
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(op.add(j * hd + c));
        }
        for i in 0..r {
            let v0 = T::load16(vp.add(i * stride + c));
            for (a, w) in acc.iter_mut().zip(w) {
                *a = _mm512_fmadd_ps(_mm512_set1_ps(w[i]), v0, *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(op.add(j * hd + c), *a);
        }
    }
}

/// The AVX-512 table's one-query entry ([`attend::attend`]).
pub(crate) fn entry<T: Row16 + attend::KvElem>(
    q: &[f32],
    kv: KvPages<'_, T>,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    if !q.len().is_multiple_of(16) {
        return super::attend::entry(q, kv, n_ctx, scale, out);
    }
    attend::check(q, &kv, n_ctx, out);
    // SAFETY: the AVX-512 table is only handed out after `avx512::detected()` (AVX2, FMA, F16C,
    // AVX-512 F/BW/VL); the head length is a multiple
    // of 16 and every row is inside its page (`check`).
    unsafe { run(q, &[n_ctx], kv, scale, out) }
}

/// The AVX-512 table's several-query entry ([`attend::attend_many`]), as [`entry`].
pub(crate) fn entry_many<T: Row16 + attend::KvElem>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: &mut [f32],
) {
    let hd = attend::check_many(qs, n_ctx, &kv, out);
    if !hd.is_multiple_of(16) {
        return super::attend::entry_many(qs, n_ctx, kv, scale, out);
    }
    // SAFETY: as in `entry`.
    unsafe { run(qs, n_ctx, kv, scale, out) }
}
