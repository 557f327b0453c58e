//! IQ4_NL × Q8_0 and IQ4_XS × Q8_K: the nibbles index the 16 non-linear levels with `tbl`
//! (`vqtbl1q_s8`), and the signed levels go straight into the integer dot product. IQ4_XS weights each
//! 32-value sub-block's exact i32 sum by its 6-bit scale (minus 32) in i32 (at most
//! 8 · 32 · 32 · 127 · 128 < 2³¹) and scales the block once by d·d8.

use core::arch::aarch64::*;

use super::neon::{h2f, ld_f32, ld_s8, ld_u16, Acc, Block, Dot};
use crate::quant::iq::grids::KVALUES_IQ4NL;

/// The levels of the 16 low nibbles and the 16 high nibbles of `qs` (elements 0..16 and 16..32).
#[inline(always)]
unsafe fn levels(qs: *const u8) -> (int8x16_t, int8x16_t) {
    let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
    let v = vld1q_u8(qs);
    (
        vqtbl1q_s8(table, vandq_u8(v, vdupq_n_u8(0x0F))),
        vqtbl1q_s8(table, vshrq_n_u8::<4>(v)),
    )
}

/// Σ level·y over one 32-value sub-block (16 code bytes at `qs`, 32 activations at `y`).
#[inline(always)]
unsafe fn sub_sum<D: Dot>(qs: *const u8, y: *const u8) -> int32x4_t {
    let (lo, hi) = levels(qs);
    D::dot(D::dot(vdupq_n_s32(0), lo, ld_s8(y)), hi, ld_s8(y.add(16)))
}

pub(super) struct IQ4NL;

impl Block for IQ4NL {
    const W: usize = 18;
    const A: usize = 34;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let sum = sub_sum::<D>(x.add(2), y.add(2));
        let d = h2f(ld_u16(x)) * h2f(ld_u16(y));
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(sum), d);
    }
}

pub(super) struct IQ4XS;

impl Block for IQ4XS {
    const W: usize = 136;
    const A: usize = 292;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let h = ld_u16(x.add(2));
        let mut isum = vdupq_n_s32(0);
        for ib in 0..8 {
            let lo = (*x.add(4 + ib / 2) >> (4 * (ib % 2))) & 0xf;
            let hi = ((h >> (2 * ib)) & 3) as u8;
            let ls = (lo | (hi << 4)) as i32 - 32;
            let s = sub_sum::<D>(x.add(8 + 16 * ib), y.add(4 + 32 * ib));
            isum = vmlaq_n_s32(isum, s, ls);
        }
        let d = h2f(ld_u16(x)) * ld_f32(y);
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(isum), d);
    }
}
