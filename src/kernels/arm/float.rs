//! F32/F16/BF16 weight rows · f32 activations: four rows at a time, two f32x4 accumulators per row,
//! each activation vector loaded once for the four rows. Widening is exact (`fcvtl` for F16, a shift
//! for BF16); only the float association differs from the scalar reference.

use core::arch::aarch64::*;
use core::arch::asm;

use super::neon::ROWS;
use crate::quant::GgmlType;

/// A float weight format: 8 elements at a time as two f32x4, or one element.
pub(super) trait Elem {
    const SIZE: usize;
    unsafe fn load8(p: *const u8) -> (float32x4_t, float32x4_t);
    unsafe fn load1(p: *const u8) -> f32;
}

pub(super) struct F32;
pub(super) struct F16;
struct BF16;

impl Elem for F32 {
    const SIZE: usize = 4;

    #[inline(always)]
    unsafe fn load8(p: *const u8) -> (float32x4_t, float32x4_t) {
        // Byte loads: weight rows need not be 4-byte aligned.
        (
            vreinterpretq_f32_u8(vld1q_u8(p)),
            vreinterpretq_f32_u8(vld1q_u8(p.add(16))),
        )
    }

    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        super::neon::ld_f32(p)
    }
}

impl Elem for F16 {
    const SIZE: usize = 2;

    #[inline(always)]
    unsafe fn load8(p: *const u8) -> (float32x4_t, float32x4_t) {
        let h = vld1q_u8(p);
        let (lo, hi): (float32x4_t, float32x4_t);
        // Base ARMv8 NEON half → single widening; registers only.
        asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags)
        );
        (lo, hi)
    }

    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        super::neon::h2f(super::neon::ld_u16(p))
    }
}

impl Elem for BF16 {
    const SIZE: usize = 2;

    #[inline(always)]
    unsafe fn load8(p: *const u8) -> (float32x4_t, float32x4_t) {
        let h = vreinterpretq_u16_u8(vld1q_u8(p));
        (
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
            vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
        )
    }

    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        f32::from_bits((super::neon::ld_u16(p) as u32) << 16)
    }
}

/// `R` rows starting at `w` (`rb` bytes apart) · the `n` activations at `a`.
#[inline(always)]
unsafe fn dot_rows<E: Elem, const R: usize>(
    w: *const u8,
    rb: usize,
    a: *const f32,
    n: usize,
) -> [f32; R] {
    let mut acc = [[vdupq_n_f32(0.0); 2]; R];
    let full = n / 8 * 8;
    let mut i = 0;
    while i < full {
        let a0 = vld1q_f32(a.add(i));
        let a1 = vld1q_f32(a.add(i + 4));
        for (r, acc) in acc.iter_mut().enumerate() {
            let (w0, w1) = E::load8(w.add(r * rb + i * E::SIZE));
            acc[0] = vfmaq_f32(acc[0], w0, a0);
            acc[1] = vfmaq_f32(acc[1], w1, a1);
        }
        i += 8;
    }
    let mut out = [0f32; R];
    for (r, (o, acc)) in out.iter_mut().zip(&acc).enumerate() {
        let mut tail = 0f32;
        for i in full..n {
            tail += E::load1(w.add(r * rb + i * E::SIZE)) * *a.add(i);
        }
        *o = vaddvq_f32(vaddq_f32(acc[0], acc[1])) + tail;
    }
    out
}

/// # Safety
/// None beyond NEON (lengths are checked here).
#[inline(always)]
unsafe fn rows<E: Elem>(w: &[u8], a: &[f32], n_tok: usize, out: &mut [f32]) {
    if out.is_empty() {
        return;
    }
    assert!(n_tok > 0 && out.len().is_multiple_of(n_tok), "output shape");
    let n_rows = out.len() / n_tok;
    let n = a.len() / n_tok;
    let rb = n * E::SIZE;
    assert_eq!(a.len(), n * n_tok, "activation rows");
    assert_eq!(
        w.len(),
        rb * n_rows,
        "weight rows do not match the activations"
    );
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut r = 0;
    while r + ROWS <= n_rows {
        for t in 0..n_tok {
            let res = dot_rows::<E, ROWS>(wp.add(r * rb), rb, ap.add(t * n), n);
            for (i, v) in res.into_iter().enumerate() {
                out[(r + i) * n_tok + t] = v;
            }
        }
        r += ROWS;
    }
    for r in r..n_rows {
        for t in 0..n_tok {
            out[r * n_tok + t] = dot_rows::<E, 1>(wp.add(r * rb), rb, ap.add(t * n), n)[0];
        }
    }
}

/// The `float_rows` entry of both NEON tables (no dotprod needed).
pub(super) fn float_rows(ty: GgmlType, w: &[u8], a: &[f32], n_tok: usize, out: &mut [f32]) {
    // SAFETY: NEON is part of the aarch64 baseline; `rows` checks every length before reading through
    // raw pointers, and all its loads are unaligned-safe byte or element loads within those lengths.
    unsafe {
        match ty {
            GgmlType::F32 => rows::<F32>(w, a, n_tok, out),
            GgmlType::F16 => rows::<F16>(w, a, n_tok, out),
            GgmlType::BF16 => rows::<BF16>(w, a, n_tok, out),
            other => panic!("float_rows called with {other}"),
        }
    }
}
