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

/// `a · b` over the first multiple of 8 elements, four accumulators.
///
/// # Safety
/// AVX2, FMA and F16C must be available (inlined into the `#[target_feature]` function below).
#[inline(always)]
unsafe fn dot<T: Row>(a: &[f32], b: &[T]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    for (i, (a, b)) in a.chunks_exact(8).zip(b.chunks_exact(8)).enumerate() {
        // The chunks are 8 elements: the loads stay inside them.
        let (x, y) = (_mm256_loadu_ps(a.as_ptr()), T::load8(b.as_ptr()));
        acc[i % 4] = _mm256_fmadd_ps(x, y, acc[i % 4]);
    }
    hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[2]),
        _mm256_add_ps(acc[1], acc[3]),
    ))
}

/// `y ← y + a·x` over the first multiple of 8 elements.
///
/// # Safety
/// As [`dot`].
#[inline(always)]
unsafe fn axpy<T: Row>(y: &mut [f32], a: f32, x: &[T]) {
    let a = _mm256_set1_ps(a);
    for (y, x) in y.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
        let r = _mm256_fmadd_ps(a, T::load8(x.as_ptr()), _mm256_loadu_ps(y.as_ptr()));
        _mm256_storeu_ps(y.as_mut_ptr(), r);
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
        // SAFETY: as above.
        |y, w, x| unsafe { axpy(y, w, x) },
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
