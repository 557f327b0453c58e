//! IQ2_S (2.56 bpw): per 16 values, two 8-value points of the 1024-point codebook (10-bit indices: low 8
//! bits in `qs[0..32]`, high 2 in `qh`), 8 explicit sign bits per point (`qs[32..64]`) and a 4-bit scale.
//! The IQ2_M file type stores its matrices in this format.
//!
//! [`BlockFormat::quantize`] is ggml's `quantize_row_iq2_s_ref` (the same search with weights
//! `sigma2/4 + x²`; checked on tests/fixtures/iq/ref-IQ2_S.bin); [`ImatrixQuantize`] is
//! `quantize_row_iq2_s_impl`, both byte-identical with ggml.

use bytemuck::Zeroable;

use super::blocks::BlockIQ2S;
use super::grids::{IQ2S_GRID, KMASK_IQ2XS};
use super::iq2xs::search16;
use super::lattice::{self, Lattice};
use crate::quant::{f16_from_f32, f32_from_f16, nearest_int, BlockFormat, BlockQ8K, GgmlType};
use crate::quant::{ImatrixQuantize, QK_K};

/// ggml's `GROUP_MAX_EPS_IQ2_S`.
const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;

/// The 8 values of point `l` (0..32) with signs applied.
fn point(b: &BlockIQ2S, l: usize) -> [i8; 8] {
    let index = b.qs[l] as usize | ((b.qh[l / 4] as usize) << (8 - 2 * (l % 4)) & 0x300);
    let grid = IQ2S_GRID[index].to_le_bytes();
    let signs = b.qs[QK_K / 8 + l];
    std::array::from_fn(|j| {
        let g = grid[j] as i8;
        if signs & KMASK_IQ2XS[j] != 0 {
            -g
        } else {
            g
        }
    })
}

impl BlockFormat for BlockIQ2S {
    const TYPE: GgmlType = GgmlType::IQ2_S;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_row(x, None, out);
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
                let mut sumi = [0i32; 2];
                for (h, s) in sumi.iter_mut().enumerate() {
                    for l in 4 * ib + 2 * h..4 * ib + 2 * h + 2 {
                        let q8 = &y.qs[8 * l..8 * l + 8];
                        *s += point(b, l)
                            .iter()
                            .zip(q8)
                            .map(|(&g, &q)| g as i32 * q as i32)
                            .sum::<i32>();
                    }
                }
                let ls1 = 1 + 2 * (b.scales[ib] & 0xf) as i32;
                let ls2 = 1 + 2 * (b.scales[ib] >> 4) as i32;
                bsum += ls1 * sumi[0] + ls2 * sumi[1];
            }
            sumf += d * bsum as f32;
        }
        0.125 * sumf
    }
}

impl ImatrixQuantize for BlockIQ2S {
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        quantize_row(x, qw, out);
    }
}

fn quantize_row(x: &[f32], qw: Option<&[f32]>, out: &mut [BlockIQ2S]) {
    assert_eq!(x.len(), out.len() * QK_K, "quantize: row length");
    if let Some(qw) = qw {
        assert_eq!(qw.len(), x.len(), "quantize: importance length");
    }
    let lat = lattice::iq2s();
    for (i, (xb, b)) in x.chunks_exact(QK_K).zip(out).enumerate() {
        *b = quantize_block(lat, xb, qw.map(|w| &w[QK_K * i..QK_K * (i + 1)]));
    }
}

/// `quantize_row_iq2_s_impl` on one super-block (float order as in ggml, no FMA).
fn quantize_block(lat: &Lattice, x: &[f32], qw: Option<&[f32]>) -> BlockIQ2S {
    let mut b = BlockIQ2S::zeroed();
    let mut scales = [0f32; 16];
    let mut max_scale = 0f32;
    let sumx2 = x.iter().fold(0f32, |s, &v| s + v * v);
    let sigma2 = 2.0 * sumx2 / QK_K as f32;
    for ib in 0..QK_K / 16 {
        let xb = &x[16 * ib..16 * ib + 16];
        let weight: [f32; 16] = match qw {
            Some(qw) => {
                let qw = &qw[16 * ib..16 * ib + 16];
                std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt())
            }
            None => std::array::from_fn(|i| 0.25 * sigma2 + xb[i] * xb[i]),
        };
        let waux = weight.map(f32::sqrt);
        let xval: [f32; 16] = std::array::from_fn(|i| if xb[i] >= 0.0 { xb[i] } else { -xb[i] });
        let mut block_signs = [0u8; 2];
        for (k, s) in block_signs.iter_mut().enumerate() {
            for i in 0..8 {
                // Negative or NaN: ggml's `else` branch of `x >= 0`.
                let nonneg = xb[8 * k + i] >= 0.0;
                if !nonneg {
                    *s |= 1 << i;
                }
            }
        }
        let max = xval[1..]
            .iter()
            .fold(xval[0], |m, &v| if m > v { m } else { v });
        if max < GROUP_MAX_EPS_IQ2_S {
            continue;
        }
        let (mut scale, l) = search16(lat, &xval, &weight, &waux, max);
        if scale < 0.0 {
            // Never expected (ggml's guard): keep the scale unsigned by flipping every sign.
            scale = -scale;
            block_signs.iter_mut().for_each(|s| *s = !*s);
        }
        for k in 0..2 {
            let index = lat
                .index(&l[8 * k..8 * k + 8])
                .expect("the search ends on grid points");
            let i8 = 2 * ib + k;
            b.qs[i8] = index as u8;
            b.qh[i8 / 4] |= ((index >> 8) as u8) << (2 * (i8 % 4));
            b.qs[QK_K / 8 + i8] = block_signs[k];
        }
        scales[ib] = scale;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    if max_scale == 0.0 {
        return b;
    }
    let d = max_scale / 31.0;
    b.d = f16_from_f32(d * 0.9875);
    let id = 1.0 / d;
    for (ib, &s) in scales.iter().enumerate() {
        let l = nearest_int(0.5 * (id * s - 1.0)).clamp(0, 15) as u8;
        b.scales[ib / 2] |= l << (4 * (ib % 2));
    }
    b
}
