//! IQ2_XS (2.31 bpw): per 16 values, two 8-value points of the 512-point codebook (each a u16 of a 9-bit
//! index and 7 sign bits, the eighth sign making the count of minus signs even) and a 4-bit scale.
//!
//! ggml has no weightless quantizer for this format (`from_float_ref` is NULL; llama-quantize refuses it
//! without an importance matrix). [`BlockFormat::quantize`] here runs the importance-weighted quantizer
//! with every column's importance 1, which is not a ggml output; [`ImatrixQuantize`] with weights is
//! byte-identical with `quantize_row_iq2_xs_impl`.

use bytemuck::Zeroable;

use super::blocks::BlockIQ2XS;
use super::grids::{IQ2XS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS};
use super::lattice::{self, Lattice, Lookup};
use super::search::{levels_sums, parity_signs, rms_weights, GROUP_MAX_EPS};
use crate::quant::{f16_from_f32, f32_from_f16, nearest_int, BlockFormat, BlockQ8K, GgmlType};
use crate::quant::{ImatrixQuantize, QK_K};

/// The 8 values of point `l` (0..32) with signs applied.
fn point(b: &BlockIQ2XS, l: usize) -> [i8; 8] {
    let q = b.qs[l];
    let grid = IQ2XS_GRID[(q & 511) as usize].to_le_bytes();
    let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
    std::array::from_fn(|j| {
        let g = grid[j] as i8;
        if signs & KMASK_IQ2XS[j] != 0 {
            -g
        } else {
            g
        }
    })
}

impl BlockFormat for BlockIQ2XS {
    const TYPE: GgmlType = GgmlType::IQ2_XS;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        let ones = vec![1.0f32; x.len()];
        Self::quantize_row_imatrix(x, Some(&ones), out);
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * QK_K, "dequantize: output length");
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f32_from_f16(b.d);
            for (l, y8) in y.chunks_exact_mut(8).enumerate() {
                let sc = b.scales[l / 4] >> (4 * (l / 2 % 2)) & 0xf;
                let db = d * (0.5 + sc as f32) * 0.25;
                for (o, q) in y8.iter_mut().zip(point(b, l)) {
                    let g = q.unsigned_abs() as f32;
                    *o = if q < 0 { -(db * g) } else { db * g };
                }
            }
        }
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sumf = 0f32;
        for (b, y) in w.iter().zip(a) {
            let d = f32_from_f16(b.d) * y.d;
            let mut bsum = 0i32;
            for ib in 0..QK_K / 32 {
                for h in 0..2 {
                    let ls = 2 * (b.scales[ib] >> (4 * h) & 0xf) as i32 + 1;
                    let mut sumi = 0i32;
                    for l in 4 * ib + 2 * h..4 * ib + 2 * h + 2 {
                        let q8 = &y.qs[8 * l..8 * l + 8];
                        sumi += point(b, l)
                            .iter()
                            .zip(q8)
                            .map(|(&g, &q)| g as i32 * q as i32)
                            .sum::<i32>();
                    }
                    bsum += sumi * ls;
                }
            }
            sumf += d * bsum as f32;
        }
        0.125 * sumf
    }
}

impl ImatrixQuantize for BlockIQ2XS {
    const NEEDS_IMATRIX: bool = true;

    /// Without weights this is [`BlockFormat::quantize`] (unit importance; ggml has no such path).
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        assert_eq!(x.len(), out.len() * QK_K, "quantize: row length");
        let Some(qw) = qw else {
            return Self::quantize(x, out);
        };
        assert_eq!(qw.len(), x.len(), "quantize: importance length");
        let lat = lattice::iq2xs();
        for ((xb, wb), b) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(out) {
            *b = quantize_block(lat, xb, wb);
        }
    }
}

/// The scale search of IQ2_XS and IQ2_S on 16 magnitudes `xval` (largest `max`): returns the group's
/// scale and its two points' levels, always grid points.
#[allow(clippy::needless_range_loop)] // k indexes the 8-value halves of several arrays
pub(super) fn search16(
    lat: &Lattice,
    xval: &[f32; 16],
    weight: &[f32; 16],
    waux: &[f32; 16],
    max: f32,
) -> (f32, [i8; 16]) {
    const K_MAX_Q: i32 = 3;
    let mut l = [0i8; 16];
    let mut laux = [0i8; 16];
    let mut best = 0f32;
    let mut scale = max / (2 * K_MAX_Q - 1) as f32;
    let mut on_grid = [true; 2];
    let mut on_grid_aux = [true; 2];
    for is in -9..=9 {
        let id = ((2 * K_MAX_Q - 1) as f32 + is as f32 * 0.1) / max;
        let this_scale = 1.0 / id;
        for k in 0..2 {
            let r = 8 * k..8 * k + 8;
            for i in r.clone() {
                laux[i] = nearest_int(0.5 * (id * xval[i] - 1.0)).clamp(0, K_MAX_Q - 1) as i8;
            }
            on_grid_aux[k] = true;
            if let Lookup::Near(c) = lat.lookup(&laux[r.clone()]) {
                on_grid_aux[k] = false;
                let (xs, ws) = (&xval[r.clone()], &waux[r.clone()]);
                lat.best_neighbour(c, xs, ws, this_scale, &mut laux[r]);
            }
        }
        let (sumqx, sumq2) = levels_sums(weight, xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            on_grid = on_grid_aux;
        }
    }
    if on_grid.contains(&false) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..2 {
            if on_grid[k] {
                continue;
            }
            let r = 8 * k..8 * k + 8;
            for i in r.clone() {
                l[i] = nearest_int(0.5 * (id * xval[i] - 1.0)).clamp(0, K_MAX_Q - 1) as i8;
            }
            if let Lookup::Near(c) = lat.lookup(&l[r.clone()]) {
                let (xs, ws) = (&xval[r.clone()], &waux[r.clone()]);
                lat.best_neighbour(c, xs, ws, scale, &mut l[r]);
            }
        }
        let (sumqx, sumq2) = levels_sums(weight, xval, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    (scale, l)
}

/// `quantize_row_iq2_xs_impl` on one super-block (float order as in ggml, no FMA).
fn quantize_block(lat: &Lattice, x: &[f32], qw: &[f32]) -> BlockIQ2XS {
    let mut b = BlockIQ2XS::zeroed();
    let mut scales = [0f32; 16];
    let mut max_scale = 0f32;
    let sumx2 = x.iter().fold(0f32, |s, &v| s + v * v);
    let sigma2 = sumx2 / QK_K as f32;
    for ib in 0..QK_K / 16 {
        let xb = &x[16 * ib..16 * ib + 16];
        let weight: [f32; 16] = rms_weights(xb, &qw[16 * ib..16 * ib + 16], sigma2);
        let waux = weight.map(f32::sqrt);
        let mut xval = [0f32; 16];
        let mut block_signs = [0u8; 2];
        for k in 0..2 {
            block_signs[k] = parity_signs(
                &xb[8 * k..8 * k + 8],
                &weight[8 * k..8 * k + 8],
                &mut xval[8 * k..8 * k + 8],
            );
        }
        let max = xval[1..]
            .iter()
            .fold(xval[0], |m, &v| if m > v { m } else { v });
        if max < GROUP_MAX_EPS {
            continue;
        }
        let (mut scale, l) = search16(lat, &xval, &weight, &waux, max);
        if scale < 0.0 {
            // Never expected (ggml's guard): keep the scale unsigned by flipping every sign.
            scale = -scale;
            block_signs.iter_mut().for_each(|s| *s = !*s & 127);
        }
        for k in 0..2 {
            let index = lat
                .index(&l[8 * k..8 * k + 8])
                .expect("the search ends on grid points");
            b.qs[2 * ib + k] = index as u16 | (block_signs[k] as u16) << 9;
        }
        scales[ib] = scale;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    if max_scale == 0.0 {
        return BlockIQ2XS::zeroed();
    }
    let d = max_scale / 31.0;
    b.d = f16_from_f32(d);
    let id = 1.0 / d;
    for (ib, &s) in scales.iter().enumerate() {
        let l = nearest_int(0.5 * (id * s - 1.0)).clamp(0, 15) as u8;
        b.scales[ib / 2] |= l << (4 * (ib % 2));
    }
    b
}
