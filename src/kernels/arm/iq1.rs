//! IQ1_S and IQ1_M × Q8_K: 8-value points of the ternary grid gathered from the table (bytes −1, 0, 1)
//! and the integer dot product, each partial sum multiplied by its odd scale `2s + 1` in i32 lanes.
//!
//! The ±1/8 shift: IQ1_S takes it from the activation's `bsums` (per 32 values, as the reference), as a
//! second exact i32 sum. IQ1_M has a shift sign per 8 values, so its weights enter the dot product as
//! `8g ± 1` (|·| ≤ 9) and one exact sum `T = 8·Σg·q + Σ±q` replaces the reference's two: its
//! `sumi1 + sumi2/8` is exactly `T/8` (every term is below 2²⁴: |T| ≤ 256 · 9 · 15 · 128), so the float
//! result is bit-identical.

use core::arch::aarch64::*;

use super::iqgrid::{dot16, dot32, points8};
use super::kquants::{Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::neon::{h2f, ld_f32, ld_u16, Acc, Block, Dot};
use crate::quant::iq::grids::{IQ1M_DELTA, IQ1S_DELTA, IQ1S_GRID};

pub(super) struct IQ1S;

impl Block for IQ1S {
    const W: usize = 50;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let mut isum = vdupq_n_s32(0);
        for ib in 0..8 {
            // Per 32 values a u16: the high 3 index bits of its 4 points, the scale (bits 12..15) and
            // the shift's sign (bit 15).
            let qh = ld_u16(x.add(34 + 2 * ib)) as usize;
            let q = x.add(2 + 4 * ib);
            let g = |k: usize| IQ1S_GRID[*q.add(k) as usize | ((qh >> (3 * k)) & 7) << 8];
            let p = dot32::<D>(
                points8(g(0), g(1)),
                points8(g(2), g(3)),
                y.add(Q8K_QS + 32 * ib),
            );
            isum = vmlaq_n_s32(isum, p, 2 * ((qh >> 12) & 7) as i32 + 1);
        }
        // Σ ±(2s + 1)·(bsums[2ib] + bsums[2ib + 1]), widened to i32 before any addition.
        let qh = vld1q_u16(x.add(34) as *const u16);
        let ls = vreinterpretq_s16_u16(vorrq_u16(
            vshlq_n_u16::<1>(vandq_u16(vshrq_n_u16::<12>(qh), vdupq_n_u16(7))),
            vdupq_n_u16(1),
        ));
        let neg = vshrq_n_s16::<15>(vreinterpretq_s16_u16(qh));
        let ls = vsubq_s16(veorq_s16(ls, neg), neg);
        let b0 = vpaddlq_s16(vld1q_s16(y.add(Q8K_BSUMS) as *const i16));
        let b1 = vpaddlq_s16(vld1q_s16(y.add(Q8K_BSUMS + 16) as *const i16));
        let shift = vmlaq_s32(
            vmulq_s32(b0, vmovl_s16(vget_low_s16(ls))),
            b1,
            vmovl_high_s16(ls),
        );
        let (sumi, sumi1) = (vaddvq_s32(isum), vaddvq_s32(shift));
        acc.s += h2f(ld_u16(x)) * ld_f32(y) * (sumi as f32 + IQ1S_DELTA * sumi1 as f32);
    }

    #[inline(always)]
    unsafe fn finish(acc: Acc) -> f32 {
        acc.s
    }
}

/// Shift-sign bits of a `qh` byte: bit 3 for its first point (lanes 0..8), bit 7 for its second.
static IQ1M_MINUS: [u8; 16] = [
    0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
];

pub(super) struct IQ1M;

impl Block for IQ1M {
    const W: usize = 56;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        // Four u16 scale words: 3-bit scales of 16-value groups 4k..4k+4 in bits 0..12 of word k, the
        // f16 super-scale in their top nibbles.
        let sc: [u16; 4] = core::array::from_fn(|k| ld_u16(x.add(48 + 2 * k)));
        let d =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
        let minus = vld1q_u8(IQ1M_MINUS.as_ptr());
        let mut isum = vdupq_n_s32(0);
        for gr in 0..16 {
            // Per 16 values a qh byte: high index bits of the two points (bits 0..3, 4..7) and their
            // shift signs (bits 3, 7).
            let qh = *x.add(32 + gr);
            let lo = ld_u16(x.add(2 * gr)).to_le_bytes();
            let hi = qh as usize;
            let g0 = IQ1S_GRID[lo[0] as usize | ((hi << 8) & 0x700)];
            let g1 = IQ1S_GRID[lo[1] as usize | ((hi << 4) & 0x700)];
            let neg = vreinterpretq_s8_u8(vtstq_u8(vdupq_n_u8(qh), minus));
            let v = vaddq_s8(
                vshlq_n_s8::<3>(points8(g0, g1)),
                vorrq_s8(neg, vdupq_n_s8(1)),
            );
            let ls = 2 * ((sc[gr / 4] >> (3 * (gr % 4))) & 7) as i32 + 1;
            isum = vmlaq_n_s32(isum, dot16::<D>(v, y.add(Q8K_QS + 16 * gr)), ls);
        }
        // T/8 (IQ1M_DELTA is 1/8; iq_lattice_rows_bit_identical fails if that changes).
        let t = vaddvq_s32(isum) as f32 * IQ1M_DELTA;
        acc.s += h2f(d) * ld_f32(y) * t;
    }

    #[inline(always)]
    unsafe fn finish(acc: Acc) -> f32 {
        acc.s
    }
}
