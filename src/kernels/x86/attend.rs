//! Attention over the KV cache (the streaming softmax of `kernels::attend`) with 8-lane FMA dot products
//! and updates; f16 rows are widened with F16C's `vcvtph2ps` (exact). The AVX2 and AVX-512 tables
//! share these entries.

use core::arch::x86_64::*;

use half::f16;

use super::hsum_ps;
use super::ops::exp_ps;
use crate::kernels::attend::{self, KvPages, BLOCK};

/// A KV element type: 8 consecutive elements as 8 f32 lanes.
pub(crate) trait Row: Copy {
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Row for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
}

impl Row for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<T: Row>(
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
        // SAFETY (all three): compiled with this function's features (AVX2, FMA, F16C), which the
        // caller guarantees; each checks that the rows it reads are inside its slices.
        |q, k, stride, s, r| unsafe { scores(q, k, stride, s, r) },
        |s, max| unsafe { weights(s, max) },
        |o, w, v, stride, r| unsafe { values(o, w, v, stride, r) },
    )
}

/// Raw scores of a group of `s.len()` (1 to 4) queries against key rows `0..r`: every (query, row)
/// pair gets one 8-lane accumulator over the head, chunk after chunk, and [`hsum_ps`], whatever the
/// group size. Queries × rows per register tile: 4 × 2, 2 × 4, 1 × 4 (8 accumulators), then rows one
/// at a time.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[inline(always)]
unsafe fn scores<T: Row>(qs: &[f32], k: &[T], stride: usize, s: &mut [[f32; BLOCK]], r: usize) {
    match s.len() {
        4 => scores_n::<T, 4, 2>(qs, k, stride, s, r),
        3 => scores_n::<T, 3, 2>(qs, k, stride, s, r),
        2 => scores_n::<T, 2, 4>(qs, k, stride, s, r),
        _ => scores_n::<T, 1, 4>(qs, k, stride, s, r),
    }
}

#[inline(always)]
unsafe fn scores_n<T: Row, const G: usize, const R: usize>(
    qs: &[f32],
    k: &[T],
    stride: usize,
    s: &mut [[f32; BLOCK]],
    r: usize,
) {
    let hd = qs.len() / G;
    assert!(
        s.len() == G && r <= BLOCK && hd.is_multiple_of(8) && r > 0,
        "scores: shapes"
    );
    assert!(k.len() >= (r - 1) * stride + hd, "scores: rows outside k");
    let (qp, kp) = (qs.as_ptr(), k.as_ptr());
    // Every load is at `c..c + 8` < hd of query `j < G` or of key row `< r` (checked above).
    let mut i = 0;
    while i + R <= r {
        let mut acc = [[_mm256_setzero_ps(); R]; G];
        let mut c = 0;
        while c < hd {
            let mut kr = [_mm256_setzero_ps(); R];
            for (t, kr) in kr.iter_mut().enumerate() {
                *kr = T::load8(kp.add((i + t) * stride + c));
            }
            for (j, acc) in acc.iter_mut().enumerate() {
                let q = _mm256_loadu_ps(qp.add(j * hd + c));
                for (a, &kr) in acc.iter_mut().zip(&kr) {
                    *a = _mm256_fmadd_ps(q, kr, *a);
                }
            }
            c += 8;
        }
        for (s, acc) in s.iter_mut().zip(&acc) {
            for (t, &a) in acc.iter().enumerate() {
                s[i + t] = hsum_ps(a);
            }
        }
        i += R;
    }
    while i < r {
        let mut acc = [_mm256_setzero_ps(); G];
        let mut c = 0;
        while c < hd {
            let kr = T::load8(kp.add(i * stride + c));
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j * hd + c)), kr, *a);
            }
            c += 8;
        }
        for (s, &a) in s.iter_mut().zip(&acc) {
            s[i] = hsum_ps(a);
        }
        i += 1;
    }
}

/// `s ← e^{s − max}` (the vector `exp`, also for the tail through a padded chunk); returns the sum of
/// the new values: 8 lanes, then [`hsum_ps`], then the tail in order.
///
/// # Safety
/// AVX2 and FMA must be available.
#[inline(always)]
pub(super) unsafe fn weights(s: &mut [f32], max: f32) -> f32 {
    let m = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    let mut chunks = s.chunks_exact_mut(8);
    for c in &mut chunks {
        // `c` holds exactly 8 values.
        let e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
        _mm256_storeu_ps(c.as_mut_ptr(), e);
        acc = _mm256_add_ps(acc, e);
    }
    let tail = chunks.into_remainder();
    let mut sum = hsum_ps(acc);
    if !tail.is_empty() {
        let mut pad = [max; 8];
        pad[..tail.len()].copy_from_slice(tail);
        // `pad` holds 8 values.
        let e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(pad.as_ptr()), m));
        _mm256_storeu_ps(pad.as_mut_ptr(), e);
        for (t, &e) in tail.iter_mut().zip(&pad) {
            *t = e;
            sum += e;
        }
    }
    sum
}

/// `out_j ← out_j + Σ_{i<r} w[j][i]·v_i` for a group of `w.len()` (1 to 4) queries whose outputs are
/// consecutive in `out`: 16 elements of every output at a time stay in registers while each value row is
/// loaded once for the group; every element takes one FMA per row, in row order (the same operations
/// whatever the group size).
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[inline(always)]
unsafe fn values<T: Row>(out: &mut [f32], w: &[[f32; BLOCK]], v: &[T], stride: usize, r: usize) {
    match w.len() {
        4 => values_n::<T, 4>(out, w, v, stride, r),
        3 => values_n::<T, 3>(out, w, v, stride, r),
        2 => values_n::<T, 2>(out, w, v, stride, r),
        _ => values_n::<T, 1>(out, w, v, stride, r),
    }
}

#[inline(always)]
unsafe fn values_n<T: Row, const G: usize>(
    out: &mut [f32],
    w: &[[f32; BLOCK]],
    v: &[T],
    stride: usize,
    r: usize,
) {
    let hd = out.len() / G;
    assert!(
        w.len() == G && r <= BLOCK && hd.is_multiple_of(8) && r > 0,
        "values: shapes"
    );
    assert!(v.len() >= (r - 1) * stride + hd, "values: rows outside v");
    let (op, vp) = (out.as_mut_ptr(), v.as_ptr());
    // Every access is at `c..c + 16` (or `c..c + 8`) < hd of output `j < G` or of value row `< r`.
    let mut c = 0;
    while c + 16 <= hd {
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        for (j, a) in acc.iter_mut().enumerate() {
            a[0] = _mm256_loadu_ps(op.add(j * hd + c));
            a[1] = _mm256_loadu_ps(op.add(j * hd + c + 8));
        }
        for i in 0..r {
            let row = vp.add(i * stride + c);
            let (v0, v1) = (T::load8(row), T::load8(row.add(8)));
            for (a, w) in acc.iter_mut().zip(w) {
                let wi = _mm256_set1_ps(w[i]);
                a[0] = _mm256_fmadd_ps(wi, v0, a[0]);
                a[1] = _mm256_fmadd_ps(wi, v1, a[1]);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(op.add(j * hd + c), a[0]);
            _mm256_storeu_ps(op.add(j * hd + c + 8), a[1]);
        }
        c += 16;
    }
    if c < hd {
        let mut acc = [_mm256_setzero_ps(); G];
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(op.add(j * hd + c));
        }
        for i in 0..r {
            let v0 = T::load8(vp.add(i * stride + c));
            for (a, w) in acc.iter_mut().zip(w) {
                *a = _mm256_fmadd_ps(_mm256_set1_ps(w[i]), v0, *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(op.add(j * hd + c), *a);
        }
    }
}

/// The table entry: checks the shapes, then runs the SIMD body (or the reference for odd head sizes).
/// Only reachable through the AVX2 / AVX-512 tables, which are handed out after AVX2, FMA and F16C
/// were detected.
pub(crate) fn entry<T: Row + attend::KvElem>(
    q: &[f32],
    kv: KvPages<'_, T>,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    attend::check(q, &kv, n_ctx, out);
    if !q.len().is_multiple_of(8) {
        // The SIMD loops cover multiples of 8 only; no model has such a head, but stay correct.
        return attend::attend_ref(q, kv, n_ctx, scale, out);
    }
    // SAFETY: the tables holding this entry are only handed out after `avx2::detected()` confirmed
    // AVX2, FMA and F16C; the head length is a multiple of 8 and every row is inside its page
    // (`check` above; the kernel indexes through checked slices anyway).
    unsafe { run(q, &[n_ctx], kv, scale, out) }
}

/// The several-query table entry ([`attend::attend_many`]), as [`entry`].
pub(crate) fn entry_many<T: Row + attend::KvElem>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: &mut [f32],
) {
    let hd = attend::check_many(qs, n_ctx, &kv, out);
    if !hd.is_multiple_of(8) {
        return attend::attend_many_ref(qs, n_ctx, kv, scale, out);
    }
    // SAFETY: as in `entry`: the tables holding this entry exist only on CPUs with AVX2, FMA and F16C.
    unsafe { run(qs, n_ctx, kv, scale, out) }
}
