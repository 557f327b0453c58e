//! IQ2_XXS (2.06 bpw): per 32 values, four 8-value points of the 256-point E8 lattice codebook (an 8-bit
//! index each), 4×7 sign bits (the eighth sign makes the count of minus signs even) and a 4-bit scale.
//!
//! ggml has no weightless quantizer for this format (`from_float_ref` is NULL; llama-quantize refuses it
//! without an importance matrix). [`BlockFormat::quantize`] here runs the importance-weighted quantizer
//! with every column's importance 1, which is not a ggml output; [`ImatrixQuantize`] with weights is
//! byte-identical with `quantize_row_iq2_xxs_impl`.

use bytemuck::Zeroable;

use super::blocks::BlockIQ2XXS;
use super::grids::{IQ2XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS};
use super::lattice::{self, Lattice, Lookup};
use super::search::{levels_sums, make_qp_quants, parity_signs, rms_weights, GROUP_MAX_EPS};
use crate::quant::{f16_from_f32, f32_from_f16, nearest_int, BlockFormat, BlockQ8K, GgmlType};
use crate::quant::{ImatrixQuantize, QK_K};

/// The 32 values of group `ib` as (scale multiplier `2·s + 1`, grid bytes with signs applied).
fn group(b: &BlockIQ2XXS, ib: usize) -> (i32, [i8; 32]) {
    let aux0 = b.qs[4 * ib] as u32 | (b.qs[4 * ib + 1] as u32) << 16;
    let aux1 = b.qs[4 * ib + 2] as u32 | (b.qs[4 * ib + 3] as u32) << 16;
    let ls = 2 * (aux1 >> 28) as i32 + 1;
    let mut v = [0i8; 32];
    for l in 0..4 {
        let grid = IQ2XXS_GRID[(aux0 >> (8 * l)) as u8 as usize].to_le_bytes();
        let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
        for j in 0..8 {
            let g = grid[j] as i8;
            v[8 * l + j] = if signs & KMASK_IQ2XS[j] != 0 { -g } else { g };
        }
    }
    (ls, v)
}

impl BlockFormat for BlockIQ2XXS {
    const TYPE: GgmlType = GgmlType::IQ2_XXS;
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
            for ib in 0..QK_K / 32 {
                let aux1 = b.qs[4 * ib + 2] as u32 | (b.qs[4 * ib + 3] as u32) << 16;
                let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
                let (_, v) = group(b, ib);
                for (o, &q) in y[32 * ib..32 * ib + 32].iter_mut().zip(&v) {
                    // ggml: db * grid[j] * (±1.f), the sign applied last.
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
                let (ls, v) = group(b, ib);
                let q8 = &y.qs[32 * ib..32 * ib + 32];
                let sumi: i32 = v.iter().zip(q8).map(|(&g, &q)| g as i32 * q as i32).sum();
                bsum += sumi * ls;
            }
            sumf += d * bsum as f32;
        }
        0.125 * sumf
    }
}

impl ImatrixQuantize for BlockIQ2XXS {
    const NEEDS_IMATRIX: bool = true;

    /// Without weights this is [`BlockFormat::quantize`] (unit importance; ggml has no such path).
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        assert_eq!(x.len(), out.len() * QK_K, "quantize: row length");
        let Some(qw) = qw else {
            return Self::quantize(x, out);
        };
        assert_eq!(qw.len(), x.len(), "quantize: importance length");
        let lat = lattice::iq2xxs();
        for ((xb, wb), b) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(out) {
            *b = quantize_block(lat, xb, wb);
        }
    }
}

/// `quantize_row_iq2_xxs_impl` on one super-block (float order as in ggml, no FMA).
fn quantize_block(lat: &Lattice, x: &[f32], qw: &[f32]) -> BlockIQ2XXS {
    const K_MAX_Q: i32 = 3;
    let mut q2 = [0u32; 16];
    let mut scales = [0f32; 8];
    let mut max_scale = 0f32;
    let sumx2 = x.iter().fold(0f32, |s, &v| s + v * v);
    let sigma2 = sumx2 / QK_K as f32;
    for ib in 0..QK_K / 32 {
        let xb = &x[32 * ib..32 * ib + 32];
        let weight: [f32; 32] = rms_weights(xb, &qw[32 * ib..32 * ib + 32], sigma2);
        let waux = weight.map(f32::sqrt);
        let mut xval = [0f32; 32];
        let mut block_signs = [0u8; 4];
        for k in 0..4 {
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
        let mut lq = [0u8; 32];
        let mut scale = make_qp_quants(K_MAX_Q + 1, &xval, &mut lq, &weight);
        let eff_max = scale * K_MAX_Q as f32;
        if eff_max <= 0.0 {
            continue;
        }
        let mut l = [0i8; 32];
        let mut laux = [0i8; 32];
        let mut best = 0f32;
        for is in -6..=6 {
            let id = ((2 * K_MAX_Q - 1) as f32 + is as f32 * 0.1) / eff_max;
            let this_scale = 1.0 / id;
            for k in 0..4 {
                let r = 8 * k..8 * k + 8;
                for i in r.clone() {
                    laux[i] = nearest_int(0.5 * (id * xval[i] - 1.0)).clamp(0, K_MAX_Q - 1) as i8;
                }
                if let Lookup::Near(c) = lat.lookup(&laux[r.clone()]) {
                    let (xs, ws) = (&xval[r.clone()], &waux[r.clone()]);
                    lat.best_neighbour(c, xs, ws, this_scale, &mut laux[r]);
                }
            }
            let (sumqx, sumq2) = levels_sums(&weight, &xval, &laux);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                l = laux;
            }
        }
        if scale > 0.0 {
            let id = 1.0 / scale;
            for k in 0..4 {
                let r = 8 * k..8 * k + 8;
                for i in r.clone() {
                    l[i] = nearest_int(0.5 * (id * xval[i] - 1.0)).clamp(0, K_MAX_Q - 1) as i8;
                }
                if let Lookup::Near(c) = lat.lookup(&l[r.clone()]) {
                    let (xs, ws) = (&xval[r.clone()], &waux[r.clone()]);
                    lat.best_neighbour(c, xs, ws, scale, &mut l[r]);
                }
            }
            let (sumqx, sumq2) = levels_sums(&weight, &xval, &l);
            if sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        if scale < 0.0 {
            // Never expected (ggml's guard): keep the scale unsigned by flipping every sign.
            scale = -scale;
            block_signs.iter_mut().for_each(|s| *s = !*s & 127);
        }
        for k in 0..4 {
            let index = lat
                .index(&l[8 * k..8 * k + 8])
                .expect("the search ends on grid points");
            q2[2 * ib] |= (index as u32) << (8 * k);
            q2[2 * ib + 1] |= (block_signs[k] as u32) << (7 * k);
        }
        scales[ib] = scale;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    let mut b = BlockIQ2XXS::zeroed();
    if max_scale == 0.0 {
        return b;
    }
    let d = max_scale / 31.0;
    b.d = f16_from_f32(d);
    let id = 1.0 / d;
    for (ib, &s) in scales.iter().enumerate() {
        let l = nearest_int(0.5 * (id * s - 1.0)).clamp(0, 15);
        q2[2 * ib + 1] |= (l as u32) << 28;
    }
    for (i, w) in q2.iter().enumerate() {
        b.qs[2 * i] = *w as u16;
        b.qs[2 * i + 1] = (*w >> 16) as u16;
    }
    b
}
