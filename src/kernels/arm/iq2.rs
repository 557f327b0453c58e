//! IQ2_XXS, IQ2_XS and IQ2_S × Q8_K: per 32 values, four 8-value grid points gathered from the tables,
//! signs applied from the 7-bit parity patterns (XXS, XS) or the explicit sign bytes (S), then the
//! integer dot product. Each 32- (XXS) or 16-value (XS, S) partial sum is multiplied by its odd scale
//! `2s + 1` in i32 lanes (|Σ| ≤ 256 · 43 · 128 · 31 < 2³¹); per block `d·bsum` is added to the row's
//! sum as the reference does, and the row's sum is multiplied by 1/8 at the end.

use core::arch::aarch64::*;

use super::iqgrid::{apply_signs, dot16, dot32, parity_signs, points8, sign_masks};
use super::kquants::{Q8K_BYTES, Q8K_QS};
use super::neon::{h2f, ld_f32, ld_u16, ld_u32, Acc, Block, Dot};
use crate::quant::iq::grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};

/// `acc.s += d_w·d_y · bsum` with the block's exact sum `isum` (lanes added).
#[inline(always)]
unsafe fn add_block(acc: &mut Acc, x: *const u8, y: *const u8, isum: int32x4_t) {
    let d = h2f(ld_u16(x)) * ld_f32(y);
    acc.s += d * vaddvq_s32(isum) as f32;
}

/// The two 16-value halves of a 32-value sub-block (scale nibbles `sc`): `isum += Σ·(2s + 1)` each.
#[inline(always)]
unsafe fn halves<D: Dot>(
    isum: int32x4_t,
    v0: int8x16_t,
    v1: int8x16_t,
    y: *const u8,
    sc: u8,
) -> int32x4_t {
    let isum = vmlaq_n_s32(isum, dot16::<D>(v0, y), 2 * (sc & 0xF) as i32 + 1);
    vmlaq_n_s32(isum, dot16::<D>(v1, y.add(16)), 2 * (sc >> 4) as i32 + 1)
}

pub(super) struct IQ2XXS;

impl Block for IQ2XXS {
    const W: usize = 66;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let mut isum = vdupq_n_s32(0);
        for ib in 0..8 {
            // Four grid indices (bytes), then 4×7 sign bits and the scale in the top nibble.
            let idx = ld_u32(x.add(2 + 8 * ib)).to_le_bytes();
            let aux = ld_u32(x.add(6 + 8 * ib));
            let (n0, n1) = sign_masks(parity_signs(aux));
            let g = |k: usize| IQ2XXS_GRID[idx[k] as usize];
            let v0 = apply_signs(points8(g(0), g(1)), n0);
            let v1 = apply_signs(points8(g(2), g(3)), n1);
            let p = dot32::<D>(v0, v1, y.add(Q8K_QS + 32 * ib));
            isum = vmlaq_n_s32(isum, p, 2 * (aux >> 28) as i32 + 1);
        }
        add_block(acc, x, y, isum);
    }

    #[inline(always)]
    unsafe fn finish(acc: Acc) -> f32 {
        0.125 * acc.s
    }
}

pub(super) struct IQ2XS;

impl Block for IQ2XS {
    const W: usize = 74;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let mut isum = vdupq_n_s32(0);
        for ib in 0..8 {
            // Each u16: a 9-bit grid index and a 7-bit sign pattern.
            let q: [u16; 4] = core::array::from_fn(|k| ld_u16(x.add(2 + 8 * ib + 2 * k)));
            let pat = q.iter().rev().fold(0u32, |s, &q| s << 7 | (q >> 9) as u32);
            let (n0, n1) = sign_masks(parity_signs(pat));
            let g = |k: usize| IQ2XS_GRID[(q[k] & 511) as usize];
            let v0 = apply_signs(points8(g(0), g(1)), n0);
            let v1 = apply_signs(points8(g(2), g(3)), n1);
            isum = halves::<D>(isum, v0, v1, y.add(Q8K_QS + 32 * ib), *x.add(66 + ib));
        }
        add_block(acc, x, y, isum);
    }

    #[inline(always)]
    unsafe fn finish(acc: Acc) -> f32 {
        0.125 * acc.s
    }
}

pub(super) struct IQ2S;

impl Block for IQ2S {
    const W: usize = 82;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let mut isum = vdupq_n_s32(0);
        for ib in 0..8 {
            // Low 8 index bits in qs[4ib..], the high 2 of point k in bits 2k..2k+2 of qh[ib]; the
            // sign bytes follow the 32 index bytes.
            let lo = ld_u32(x.add(2 + 4 * ib)).to_le_bytes();
            let qh = *x.add(66 + ib) as usize;
            let g = |k: usize| IQ2S_GRID[lo[k] as usize | ((qh << (8 - 2 * k)) & 0x300)];
            let (n0, n1) = sign_masks(ld_u32(x.add(34 + 4 * ib)));
            let v0 = apply_signs(points8(g(0), g(1)), n0);
            let v1 = apply_signs(points8(g(2), g(3)), n1);
            isum = halves::<D>(isum, v0, v1, y.add(Q8K_QS + 32 * ib), *x.add(74 + ib));
        }
        add_block(acc, x, y, isum);
    }

    #[inline(always)]
    unsafe fn finish(acc: Acc) -> f32 {
        0.125 * acc.s
    }
}
