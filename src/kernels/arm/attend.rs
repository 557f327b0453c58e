//! Attention over the KV cache (the grouped streaming softmax of `kernels::attend`) with NEON: up to
//! four queries (half of a group of up to eight) served by each load of a key or value row, four-lane
//! FMAs, weights by the vector `exp`; f16 rows are widened with the base ARMv8 `fcvtl`/`fcvtl2`
//! (exact), as the F16 weight kernels do. Both NEON tables share these entries (no dotprod needed).

use core::arch::aarch64::*;
use core::arch::asm;

use half::f16;

use super::float::{self, Elem};
use super::ops::exp_q;
use crate::kernels::attend::{self, AttnOut, KvElem, KvPages, BLOCK, PF_ROWS};
use crate::kernels::dispatch::AttendSteps;

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

/// Raw scores of a group of 1 to 8 queries against key rows `0..r` ([`attend::body_grouped`]): each
/// (query, row) pair gets two 4-lane accumulators (the halves of each 8-element chunk) over the head,
/// then their sum across lanes, whatever the group size. Tiles of 4 × 2, 3 × 2, 2 × 4 and 1 × 4 pairs
/// (16 accumulators at most), then rows one at a time. With `fetch` (the block's first group; the others
/// find the rows in cache) each tile prefetches the key rows [`PF_ROWS`] ahead and its value rows `v`
/// (see [`prefetch_rows`]).
///
/// # Safety
/// NEON only (the aarch64 baseline); the loads are checked to stay inside the slices.
#[inline(always)]
unsafe fn scores<T: Row>(
    qs: &[f32],
    k: &[T],
    v: &[T],
    stride: usize,
    s: &mut [[f32; BLOCK]],
    r: usize,
    fetch: bool,
) {
    if s.len() > 4 {
        // The first four queries and the rest as two groups: the same operations per pair.
        let hd = qs.len() / s.len();
        let (s0, s1) = s.split_at_mut(4);
        scores4(&qs[..4 * hd], k, v, stride, s0, r, fetch);
        return scores4(&qs[4 * hd..], k, v, stride, s1, r, false);
    }
    scores4(qs, k, v, stride, s, r, fetch)
}

/// [`scores`] for 1 to 4 queries (not recursive, so that it is always inlined).
#[inline(always)]
unsafe fn scores4<T: Row>(
    qs: &[f32],
    k: &[T],
    v: &[T],
    stride: usize,
    s: &mut [[f32; BLOCK]],
    r: usize,
    fetch: bool,
) {
    match s.len() {
        4 => scores_n::<T, 4, 2>(qs, k, v, stride, s, r, fetch),
        3 => scores_n::<T, 3, 2>(qs, k, v, stride, s, r, fetch),
        2 => scores_n::<T, 2, 4>(qs, k, v, stride, s, r, fetch),
        _ => scores_n::<T, 1, 4>(qs, k, v, stride, s, r, fetch),
    }
}

#[inline(always)]
unsafe fn scores_n<T: Row, const G: usize, const R: usize>(
    qs: &[f32],
    k: &[T],
    v: &[T],
    stride: usize,
    s: &mut [[f32; BLOCK]],
    r: usize,
    fetch: bool,
) {
    let hd = qs.len() / G;
    assert!(
        s.len() == G && r <= BLOCK && hd.is_multiple_of(8) && r > 0,
        "scores: shapes"
    );
    assert!(k.len() >= (r - 1) * stride + hd, "scores: rows outside k");
    let (qp, kp) = (qs.as_ptr(), k.as_ptr());
    let z = vdupq_n_f32(0.0);
    // Every load is at `c..c + 8` < hd of query `j < G` or of key row `< r` (checked above).
    let mut i = 0;
    while i + R <= r {
        // Decoding reads each row once, straight from memory: fetch the keys a few rows ahead (the
        // next block's first ones at the end) and this block's values for the value pass to come.
        if fetch {
            prefetch_rows::<L1, T>(kp, (i + PF_ROWS) * stride, R, stride, hd);
            prefetch_rows::<L2, T>(v.as_ptr(), i * stride, R, stride, hd);
        }
        let mut acc = [[[z; 2]; R]; G];
        let mut c = 0;
        while c < hd {
            let mut kr = [[z; 2]; R];
            for (t, kr) in kr.iter_mut().enumerate() {
                let (k0, k1) = T::E::load8(kp.add((i + t) * stride + c) as *const u8);
                *kr = [k0, k1];
            }
            for (j, acc) in acc.iter_mut().enumerate() {
                let (q0, q1) = (
                    vld1q_f32(qp.add(j * hd + c)),
                    vld1q_f32(qp.add(j * hd + c + 4)),
                );
                for (a, kr) in acc.iter_mut().zip(&kr) {
                    a[0] = vfmaq_f32(a[0], q0, kr[0]);
                    a[1] = vfmaq_f32(a[1], q1, kr[1]);
                }
            }
            c += 8;
        }
        for (s, acc) in s.iter_mut().zip(&acc) {
            for (t, a) in acc.iter().enumerate() {
                s[i + t] = vaddvq_f32(vaddq_f32(a[0], a[1]));
            }
        }
        i += R;
    }
    while i < r {
        let mut acc = [[z; 2]; G];
        let mut c = 0;
        while c < hd {
            let (k0, k1) = T::E::load8(kp.add(i * stride + c) as *const u8);
            for (j, a) in acc.iter_mut().enumerate() {
                a[0] = vfmaq_f32(a[0], vld1q_f32(qp.add(j * hd + c)), k0);
                a[1] = vfmaq_f32(a[1], vld1q_f32(qp.add(j * hd + c + 4)), k1);
            }
            c += 8;
        }
        for (s, a) in s.iter_mut().zip(&acc) {
            s[i] = vaddvq_f32(vaddq_f32(a[0], a[1]));
        }
        i += 1;
    }
}

/// Prefetch targets: `prfm pldl1keep` and `prfm pldl2keep`.
const L1: u8 = 1;
const L2: u8 = 2;

/// Prefetches (into cache level `LEVEL`) `n` rows of `len` elements ([`attend::for_row_lines`]). The
/// intrinsic is unstable, so the instruction is emitted with `asm!`.
#[inline(always)]
fn prefetch_rows<const LEVEL: u8, T>(p: *const T, at: usize, n: usize, stride: usize, len: usize) {
    attend::for_row_lines(p, at, n, stride, len, |a| {
        // SAFETY: a prefetch reads nothing architecturally and never faults, whatever the address.
        unsafe {
            if LEVEL == L1 {
                asm!(
                    "prfm pldl1keep, [{a}]",
                    a = in(reg) a,
                    options(nostack, preserves_flags, readonly)
                );
            } else {
                asm!(
                    "prfm pldl2keep, [{a}]",
                    a = in(reg) a,
                    options(nostack, preserves_flags, readonly)
                );
            }
        }
    });
}

/// `s ← e^{s − max}` by the vector `exp` (the tail through a padded chunk); returns their sum: 4 lanes,
/// then across lanes, then the tail in order.
///
/// # Safety
/// NEON only.
#[inline(always)]
unsafe fn weights(s: &mut [f32], max: f32) -> f32 {
    let m = vdupq_n_f32(max);
    let mut acc = vdupq_n_f32(0.0);
    let mut chunks = s.chunks_exact_mut(4);
    for c in &mut chunks {
        // `c` holds exactly 4 values.
        let e = exp_q(vsubq_f32(vld1q_f32(c.as_ptr()), m));
        vst1q_f32(c.as_mut_ptr(), e);
        acc = vaddq_f32(acc, e);
    }
    let tail = chunks.into_remainder();
    let mut sum = vaddvq_f32(acc);
    if !tail.is_empty() {
        let mut pad = [max; 4];
        pad[..tail.len()].copy_from_slice(tail);
        // `pad` holds 4 values.
        let e = exp_q(vsubq_f32(vld1q_f32(pad.as_ptr()), m));
        vst1q_f32(pad.as_mut_ptr(), e);
        for (t, &e) in tail.iter_mut().zip(&pad) {
            *t = e;
            sum += e;
        }
    }
    sum
}

/// `out_j ← out_j + Σ_{i<r} w[j][i]·v_i` for a group of 1 to 8 queries (outputs consecutive in `out`):
/// 8 elements of every output in registers while each value row is loaded once for the group; one FMA
/// per element and row, in row order.
///
/// # Safety
/// NEON only; the accesses are checked to stay inside the slices.
#[inline(always)]
unsafe fn values<T: Row>(out: &mut [f32], w: &[[f32; BLOCK]], v: &[T], stride: usize, r: usize) {
    if w.len() > 4 {
        // The first four outputs and the rest as two groups (the same operations).
        let hd = out.len() / w.len();
        let (o0, o1) = out.split_at_mut(4 * hd);
        values4(o0, &w[..4], v, stride, r);
        return values4(o1, &w[4..], v, stride, r);
    }
    values4(out, w, v, stride, r)
}

/// [`values`] for 1 to 4 queries (not recursive, so that it is always inlined).
#[inline(always)]
unsafe fn values4<T: Row>(out: &mut [f32], w: &[[f32; BLOCK]], v: &[T], stride: usize, r: usize) {
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
    // Every access is at `c..c + 8` < hd of output `j < G` or of value row `< r`.
    for c in (0..hd).step_by(8) {
        let mut acc = [[vdupq_n_f32(0.0); 2]; G];
        for (j, a) in acc.iter_mut().enumerate() {
            *a = [
                vld1q_f32(op.add(j * hd + c)),
                vld1q_f32(op.add(j * hd + c + 4)),
            ];
        }
        for i in 0..r {
            let (v0, v1) = T::E::load8(vp.add(i * stride + c) as *const u8);
            for (a, w) in acc.iter_mut().zip(w) {
                a[0] = vfmaq_n_f32(a[0], v0, w[i]);
                a[1] = vfmaq_n_f32(a[1], v1, w[i]);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            vst1q_f32(op.add(j * hd + c), a[0]);
            vst1q_f32(op.add(j * hd + c + 4), a[1]);
        }
    }
}

/// The grouped body with this file's tiles.
#[inline(always)]
fn run<T: Row>(qs: &[f32], n_ctx: &[usize], kv: KvPages<'_, T>, scale: f32, out: AttnOut<'_>) {
    attend::body_grouped(
        qs,
        n_ctx,
        kv,
        scale,
        out,
        attend::GROUP,
        // SAFETY (all three): NEON is part of the aarch64 baseline; each checks that the rows it reads
        // are inside its slices.
        |i0, q, k, v, stride, s, r| unsafe { scores(q, k, v, stride, s, r, i0 == 0) },
        |s, max, sum| *sum += unsafe { weights(s, max) } as f64,
        |o, w, v, stride, r| unsafe { values(o, w, v, stride, r) },
    )
}

/// The one-query table entry ([`attend::attend`]): the several-query entry with one query.
pub(super) fn entry<T: Row>(
    q: &[f32],
    kv: KvPages<'_, T>,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    entry_many(q, &[n_ctx], kv, scale, AttnOut::Whole(out))
}

/// The several-query table entry ([`attend::attend_many`]): checks the shapes, then runs the NEON body
/// (or the reference for heads that are not a multiple of 8 long).
pub(super) fn entry_many<T: Row>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: AttnOut<'_>,
) {
    let hd = attend::check_many(qs, n_ctx, &kv, &out);
    if !hd.is_multiple_of(8) {
        // The SIMD loops cover multiples of 8 only; no model has such a head, but stay correct.
        return attend::attend_many_ref(qs, n_ctx, kv, scale, out);
    }
    run(qs, n_ctx, kv, scale, out)
}

/// The NEON tables' attention steps over f32 rows ([`AttendSteps`]): the grouped body's own weights and
/// values.
pub(super) const STEPS: AttendSteps = AttendSteps {
    weights: weights_neon,
    values: values_neon,
};

fn weights_neon(s: &mut [f32], max: f32, sum: &mut f64) {
    // SAFETY: NEON is the aarch64 baseline.
    *sum += unsafe { weights(s, max) } as f64;
}

fn values_neon(out: &mut [f32], w: &[[f32; BLOCK]], v: &[f32], stride: usize, r: usize) {
    if !(out.len() / w.len()).is_multiple_of(8) {
        return attend::values_ref(out, w, v, stride, r);
    }
    // SAFETY: NEON only; `values_n` checks that its rows are inside `v`.
    unsafe { values::<f32>(out, w, v, stride, r) }
}
