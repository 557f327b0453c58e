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

/// `a · b` over the first multiple of 8 elements, four accumulators (chunk `i` of 8 into accumulators
/// `2·(i % 2)` and `2·(i % 2) + 1`), 16 elements per step so the accumulators stay in registers (indexed by
/// `i % 2` in a rolled loop they lived on the stack).
///
/// # Safety
/// NEON only (the aarch64 baseline); the loads stay inside the first `n` elements of both slices.
#[inline(always)]
unsafe fn dot<T: Row>(a: &[f32], b: &[T]) -> f32 {
    let n = a.len().min(b.len()) / 8 * 8;
    let (a, b) = (&a[..n], &b[..n]);
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let z = vdupq_n_f32(0.0);
    let [mut s0, mut s1, mut s2, mut s3] = [z; 4];
    let mut i = 0;
    while i + 16 <= n {
        let (b0, b1) = T::E::load8(bp.add(i) as *const u8);
        s0 = vfmaq_f32(s0, vld1q_f32(ap.add(i)), b0);
        s1 = vfmaq_f32(s1, vld1q_f32(ap.add(i + 4)), b1);
        let (b2, b3) = T::E::load8(bp.add(i + 8) as *const u8);
        s2 = vfmaq_f32(s2, vld1q_f32(ap.add(i + 8)), b2);
        s3 = vfmaq_f32(s3, vld1q_f32(ap.add(i + 12)), b3);
        i += 16;
    }
    if i < n {
        let (b0, b1) = T::E::load8(bp.add(i) as *const u8);
        s0 = vfmaq_f32(s0, vld1q_f32(ap.add(i)), b0);
        s1 = vfmaq_f32(s1, vld1q_f32(ap.add(i + 4)), b1);
    }
    vaddvq_f32(vaddq_f32(vaddq_f32(s0, s2), vaddq_f32(s1, s3)))
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

/// The several-query table entry ([`attend::attend_many`]), as [`entry`].
pub(super) fn entry_many<T: Row>(
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
    attend::body_many(
        qs,
        n_ctx,
        kv,
        scale,
        out,
        hd,
        // SAFETY: as in `entry`.
        |_, a, b| unsafe { dot(a, b) },
        |y, w, v, stride| {
            // SAFETY: as in `entry`.
            attend::each_row(y, w, v, stride, |y, w, x| unsafe { axpy(y, w, x) })
        },
    )
}
