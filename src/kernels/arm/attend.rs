//! Attention over the KV cache (the streaming softmax of `kernels::attend`) with NEON: four-lane FMA dot
//! products and updates; f16 rows are widened with the base ARMv8 `fcvtl`/`fcvtl2` (exact), as the F16
//! weight kernels do. Both NEON tables share these entries (no dotprod needed).

use core::arch::aarch64::*;

use half::f16;

use super::float::{self, Elem};
use crate::kernels::attend::{self, KvElem, KvPages};

/// A KV element type and its loader of 8 consecutive elements as two f32x4.
pub(super) trait Row: KvElem {
    type E: Elem;
}

impl Row for f32 {
    type E = float::F32;
}

impl Row for f16 {
    type E = float::F16;
}

/// `a · b` over the first multiple of 8 elements, four accumulators.
///
/// # Safety
/// NEON only (the aarch64 baseline); the loads stay inside 8-element chunks.
#[inline(always)]
unsafe fn dot<T: Row>(a: &[f32], b: &[T]) -> f32 {
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (i, (a, b)) in a.chunks_exact(8).zip(b.chunks_exact(8)).enumerate() {
        let (b0, b1) = T::E::load8(b.as_ptr() as *const u8);
        let j = 2 * (i % 2);
        acc[j] = vfmaq_f32(acc[j], vld1q_f32(a.as_ptr()), b0);
        acc[j + 1] = vfmaq_f32(acc[j + 1], vld1q_f32(a.as_ptr().add(4)), b1);
    }
    vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[2]),
        vaddq_f32(acc[1], acc[3]),
    ))
}

/// `y ← y + a·x` over the first multiple of 8 elements.
///
/// # Safety
/// As [`dot`].
#[inline(always)]
unsafe fn axpy<T: Row>(y: &mut [f32], a: f32, x: &[T]) {
    for (y, x) in y.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
        let (x0, x1) = T::E::load8(x.as_ptr() as *const u8);
        let p = y.as_mut_ptr();
        vst1q_f32(p, vfmaq_n_f32(vld1q_f32(p), x0, a));
        vst1q_f32(p.add(4), vfmaq_n_f32(vld1q_f32(p.add(4)), x1, a));
    }
}

/// The table entry: checks the shapes, then runs the NEON body (or the reference for odd head sizes).
pub(super) fn entry<T: Row>(
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
    attend::body(
        q,
        kv,
        n_ctx,
        scale,
        out,
        // SAFETY: NEON is part of the aarch64 baseline; `dot` and `axpy` only load and store inside
        // 8-element chunks of the slices they are given.
        |a, b| unsafe { dot(a, b) },
        |y, w, v, stride| {
            // SAFETY: as above.
            attend::each_row(y, w, v, stride, |y, w, x| unsafe { axpy(y, w, x) })
        },
    )
}
