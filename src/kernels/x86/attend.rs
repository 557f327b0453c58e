//! Attention over the KV cache (the streaming softmax of `kernels::attend`) with 8-lane FMA dot products
//! and updates; f16 rows are widened with F16C's `vcvtph2ps` (exact). The AVX2 and AVX-512 tables
//! share these entries.

use core::arch::x86_64::*;

use half::f16;

use super::hsum_ps;
use crate::kernels::attend::{self, KvPages};

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

/// `a · b` over the first multiple of 8 elements, four accumulators (chunk `i` of 8 into accumulator
/// `i % 4`), 32 elements per step so the accumulators stay in registers.
///
/// # Safety
/// AVX2, FMA and F16C must be available (inlined into the `#[target_feature]` function below).
#[inline(always)]
unsafe fn dot<T: Row>(a: &[f32], b: &[T]) -> f32 {
    let n = a.len().min(b.len()) / 8 * 8;
    let (a, b) = (&a[..n], &b[..n]);
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let [mut s0, mut s1, mut s2, mut s3] = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // Loads at `i..i + 32` (then `i..i + 8`) stay inside the first `n` elements of both slices.
    while i + 32 <= n {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(ap.add(i)), T::load8(bp.add(i)), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(ap.add(i + 8)), T::load8(bp.add(i + 8)), s1);
        s2 = _mm256_fmadd_ps(
            _mm256_loadu_ps(ap.add(i + 16)),
            T::load8(bp.add(i + 16)),
            s2,
        );
        s3 = _mm256_fmadd_ps(
            _mm256_loadu_ps(ap.add(i + 24)),
            T::load8(bp.add(i + 24)),
            s3,
        );
        i += 32;
    }
    let mut rest = [s0, s1, s2, s3];
    let mut k = 0;
    while i < n {
        rest[k] = _mm256_fmadd_ps(_mm256_loadu_ps(ap.add(i)), T::load8(bp.add(i)), rest[k]);
        i += 8;
        k += 1;
    }
    hsum_ps(_mm256_add_ps(
        _mm256_add_ps(rest[0], rest[2]),
        _mm256_add_ps(rest[1], rest[3]),
    ))
}

/// `y ← y + Σᵢ w[i]·v[i]` for the rows `v[i] = v[i·stride..][..y.len()]`: 64 elements of `y` at a time
/// stay in 8 registers while every row is applied to them, in row order, by one FMA each (so the sums
/// are bit-identical to a pass over `y` per row, which cost a load and a store of `y` per row).
///
/// # Safety
/// As [`dot`]; `y.len()` must be a multiple of 8.
#[inline(always)]
unsafe fn axpy_rows<T: Row>(y: &mut [f32], w: &[f32], v: &[T], stride: usize) {
    let hd = y.len();
    if w.is_empty() {
        return;
    }
    assert!(
        hd.is_multiple_of(8) && v.len() >= (w.len() - 1) * stride + hd,
        "axpy_rows: rows outside v"
    );
    let (yp, vp) = (y.as_mut_ptr(), v.as_ptr());
    // Every access below is at `c + 8k..+8` < hd of `y`, or of row i < w.len() of `v` (checked above).
    let mut c = 0;
    while c + 64 <= hd {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(yp.add(c + 8 * k));
        }
        for (i, &wi) in w.iter().enumerate() {
            let a = _mm256_set1_ps(wi);
            let row = vp.add(i * stride + c);
            for (k, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(a, T::load8(row.add(8 * k)), *acc);
            }
        }
        for (k, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(yp.add(c + 8 * k), *a);
        }
        c += 64;
    }
    while c < hd {
        let mut acc = _mm256_loadu_ps(yp.add(c));
        for (i, &wi) in w.iter().enumerate() {
            acc = _mm256_fmadd_ps(_mm256_set1_ps(wi), T::load8(vp.add(i * stride + c)), acc);
        }
        _mm256_storeu_ps(yp.add(c), acc);
        c += 8;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<T: Row>(q: &[f32], kv: KvPages<'_, T>, n_ctx: usize, scale: f32, out: &mut [f32]) {
    attend::body(
        q,
        kv,
        n_ctx,
        scale,
        out,
        // SAFETY: this closure is compiled with this function's features (AVX2, FMA, F16C), which the
        // caller guarantees; `dot` only loads inside 8-element chunks.
        |a, b| unsafe { dot(a, b) },
        // SAFETY: as above; `axpy_rows` checks that its rows are inside `v`, and the head length is a
        // multiple of 8 (`entry`).
        |y, w, v, stride| unsafe { axpy_rows(y, w, v, stride) },
    )
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
    unsafe { run(q, kv, n_ctx, scale, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_many<T: Row>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: &mut [f32],
    hd: usize,
) {
    attend::body_many(
        qs,
        n_ctx,
        kv,
        scale,
        out,
        hd,
        // SAFETY: as in `run`.
        |_, a, b| unsafe { dot(a, b) },
        // SAFETY: as in `run`.
        |y, w, v, stride| unsafe { axpy_rows(y, w, v, stride) },
    )
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
    unsafe { run_many(qs, n_ctx, kv, scale, out, hd) }
}
