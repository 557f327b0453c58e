//! Block kernels of the 32-element formats (spec gguf-and-quants §3.2–3.7, §5.3):
//! Q4_0 × Q8_0, Q4_1 × Q8_1, Q5_0 × Q8_0, Q5_1 × Q8_1, Q8_0 × Q8_0.
//!
//! Each block's integer sum is exact (four i32 lanes); the lanes are scaled by `dx·dy` into the row's
//! f32 lane accumulator, and the Q8_1 min term `m·s` goes to its scalar part.

use core::arch::aarch64::*;

use super::neon::{h2f, ld_s8, ld_u16, ld_u32, Acc, Block, Dot};

/// The 16 low nibbles and the 16 high nibbles of `qs` (elements 0..16 and 16..32), as bytes 0..=15.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> (uint8x16_t, uint8x16_t) {
    let v = vld1q_u8(qs);
    (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
}

/// 0xFF in byte `e` where bit `e` of `qh` is set: elements 0..16 and 16..32.
#[inline(always)]
unsafe fn bit_masks(qh: u32) -> (uint8x16_t, uint8x16_t) {
    const SPREAD_LO: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const SPREAD_HI: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let table = vreinterpretq_u8_u32(vdupq_n_u32(qh));
    let bits = vld1q_u8(BITS.as_ptr());
    let lo = vqtbl1q_u8(table, vld1q_u8(SPREAD_LO.as_ptr()));
    let hi = vqtbl1q_u8(table, vld1q_u8(SPREAD_HI.as_ptr()));
    (vtstq_u8(lo, bits), vtstq_u8(hi, bits))
}

/// Σ x·y over one 32-element block (x as signed bytes), in four i32 lanes.
#[inline(always)]
unsafe fn block_sum<D: Dot>(x0: int8x16_t, x1: int8x16_t, y: *const u8) -> int32x4_t {
    D::dot(D::dot(vdupq_n_s32(0), x0, ld_s8(y)), x1, ld_s8(y.add(16)))
}

pub(super) struct Q4_0;

impl Block for Q4_0 {
    const W: usize = 18;
    const A: usize = 34;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let (lo, hi) = nibbles(x.add(2));
        let eight = vdupq_n_s8(8);
        let lo = vsubq_s8(vreinterpretq_s8_u8(lo), eight);
        let hi = vsubq_s8(vreinterpretq_s8_u8(hi), eight);
        let sum = block_sum::<D>(lo, hi, y.add(2));
        let d = h2f(ld_u16(x)) * h2f(ld_u16(y));
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(sum), d);
    }
}

pub(super) struct Q4_1;

impl Block for Q4_1 {
    const W: usize = 20;
    const A: usize = 36;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let (lo, hi) = nibbles(x.add(4));
        let sum = block_sum::<D>(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), y.add(4));
        let d = h2f(ld_u16(x)) * h2f(ld_u16(y));
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(sum), d);
        acc.s += h2f(ld_u16(x.add(2))) * h2f(ld_u16(y.add(2)));
    }
}

pub(super) struct Q5_0;

impl Block for Q5_0 {
    const W: usize = 22;
    const A: usize = 34;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let (m_lo, m_hi) = bit_masks(ld_u32(x.add(2)));
        let (lo, hi) = nibbles(x.add(6));
        // q − 16 = nibble − (16 where the fifth bit is clear).
        let sixteen = vdupq_n_u8(0x10);
        let lo = vsubq_s8(
            vreinterpretq_s8_u8(lo),
            vreinterpretq_s8_u8(vbicq_u8(sixteen, m_lo)),
        );
        let hi = vsubq_s8(
            vreinterpretq_s8_u8(hi),
            vreinterpretq_s8_u8(vbicq_u8(sixteen, m_hi)),
        );
        let sum = block_sum::<D>(lo, hi, y.add(2));
        let d = h2f(ld_u16(x)) * h2f(ld_u16(y));
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(sum), d);
    }
}

pub(super) struct Q5_1;

impl Block for Q5_1 {
    const W: usize = 24;
    const A: usize = 36;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let (m_lo, m_hi) = bit_masks(ld_u32(x.add(4)));
        let (lo, hi) = nibbles(x.add(8));
        let sixteen = vdupq_n_u8(0x10);
        let lo = vorrq_u8(lo, vandq_u8(m_lo, sixteen));
        let hi = vorrq_u8(hi, vandq_u8(m_hi, sixteen));
        let sum = block_sum::<D>(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), y.add(4));
        let d = h2f(ld_u16(x)) * h2f(ld_u16(y));
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(sum), d);
        acc.s += h2f(ld_u16(x.add(2))) * h2f(ld_u16(y.add(2)));
    }
}

pub(super) struct Q8_0;

impl Block for Q8_0 {
    const W: usize = 34;
    const A: usize = 34;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let sum = block_sum::<D>(ld_s8(x.add(2)), ld_s8(x.add(18)), y.add(2));
        let d = h2f(ld_u16(x)) * h2f(ld_u16(y));
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(sum), d);
    }
}
