//! IQ3_XXS and IQ3_S × Q8_K: per 32 values, eight 4-value grid points gathered from the tables, signs
//! from the 7-bit parity patterns (XXS) or the explicit sign bits (S), then the integer dot product.
//! Each 32-value sum is multiplied by its odd scale `2s + 1` in i32 lanes (|Σ| ≤ 256 · 62 · 128 · 31 <
//! 2³¹); per block `d·bsum` is added to the row's sum as the reference does, and IQ3_XXS multiplies the
//! row's sum by 1/4 at the end.

use core::arch::aarch64::*;

use super::iqgrid::{apply_signs, dot32, parity_signs, points4, sign_masks};
use super::kquants::{Q8K_BYTES, Q8K_QS};
use super::neon::{h2f, ld_f32, ld_u16, ld_u32, Acc, Block, Dot};
use crate::quant::iq::grids::{IQ3S_GRID, IQ3XXS_GRID};

/// `acc.s += d_w·d_y · bsum` with the block's exact sum `isum` (lanes added).
#[inline(always)]
unsafe fn add_block(acc: &mut Acc, x: *const u8, y: *const u8, isum: int32x4_t) {
    let d = h2f(ld_u16(x)) * ld_f32(y);
    acc.s += d * vaddvq_s32(isum) as f32;
}

pub(super) struct IQ3XXS;

impl Block for IQ3XXS {
    const W: usize = 98;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let mut isum = vdupq_n_s32(0);
        for ib in 0..8 {
            // Eight grid indices (bytes) per sub-block; after all 64, per sub-block a u32 of 4×7 sign
            // bits and the scale in the top nibble.
            let q = x.add(2 + 8 * ib);
            let aux = ld_u32(x.add(66 + 4 * ib));
            let (n0, n1) = sign_masks(parity_signs(aux));
            let g = |k: usize| IQ3XXS_GRID[*q.add(k) as usize];
            let v0 = apply_signs(points4([g(0), g(1), g(2), g(3)]), n0);
            let v1 = apply_signs(points4([g(4), g(5), g(6), g(7)]), n1);
            let p = dot32::<D>(v0, v1, y.add(Q8K_QS + 32 * ib));
            isum = vmlaq_n_s32(isum, p, 2 * (aux >> 28) as i32 + 1);
        }
        add_block(acc, x, y, isum);
    }

    #[inline(always)]
    unsafe fn finish(acc: Acc) -> f32 {
        0.25 * acc.s
    }
}

pub(super) struct IQ3S;

impl Block for IQ3S {
    const W: usize = 110;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let mut isum = vdupq_n_s32(0);
        for ib in 0..8 {
            // Low 8 index bits in qs[8ib..], the ninth of point k in bit k of qh[ib]; 32 sign bits per
            // sub-block; 4-bit scales, two per byte.
            let q = x.add(2 + 8 * ib);
            let qh = *x.add(66 + ib) as usize;
            let g = |k: usize| IQ3S_GRID[*q.add(k) as usize | ((qh >> k) & 1) << 8];
            let (n0, n1) = sign_masks(ld_u32(x.add(74 + 4 * ib)));
            let v0 = apply_signs(points4([g(0), g(1), g(2), g(3)]), n0);
            let v1 = apply_signs(points4([g(4), g(5), g(6), g(7)]), n1);
            let p = dot32::<D>(v0, v1, y.add(Q8K_QS + 32 * ib));
            let sc = (*x.add(106 + ib / 2) >> (4 * (ib % 2))) & 0xF;
            isum = vmlaq_n_s32(isum, p, 2 * sc as i32 + 1);
        }
        add_block(acc, x, y, isum);
    }

    #[inline(always)]
    unsafe fn finish(acc: Acc) -> f32 {
        acc.s
    }
}
