//! IQ3_XXS: 256 values as 64 points of the 256-point 3-bit lattice (4 values each), per 32 values 4×7
//! sign bits (the eighth makes the count of negatives even) and a 4-bit scale; 3.06 bits per weight.

use super::grids::{IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::lattice3::{self, Variant};
use super::BlockIQ3XXS;
use crate::quant::{
    f16_from_f32, f32_from_f16, BlockFormat, BlockQ8K, GgmlType, ImatrixQuantize, QK_K,
};

impl BlockIQ3XXS {
    /// The u32 of sub-block `ib`: 4×7 sign-pattern bits and the 4-bit scale in bits 28..32.
    fn scale_signs(&self, ib: usize) -> u32 {
        u32::from_le_bytes(self.qs[64 + 4 * ib..68 + 4 * ib].try_into().unwrap())
    }

    /// Sub-block `ib`'s 32 values as signed grid values (before the scales).
    fn values(&self, ib: usize) -> [i32; 32] {
        let aux = self.scale_signs(ib);
        std::array::from_fn(|e| {
            let (l, j) = (e / 8, e % 8);
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let point = IQ3XXS_GRID[self.qs[8 * ib + 2 * l + j / 4] as usize];
            let g = ((point >> (8 * (j % 4))) & 0xFF) as i32;
            if signs & (1 << j) != 0 {
                -g
            } else {
                g
            }
        })
    }

    /// ggml's `quantize_row_iq3_xxs_impl` for one super-block, `qw` its 256 importance weights.
    fn quantize_block(x: &[f32], qw: Option<&[f32]>) -> Self {
        let lat = lattice3::iq3xxs();
        let sigma2 = lattice3::sigma2(x);
        let mut q3 = [0u8; 64];
        let mut scale_signs = [0u32; 8];
        let mut scales = [0.0f32; 8];
        let mut max_scale = 0.0f32;
        for ib in 0..8 {
            let xb = &x[32 * ib..32 * ib + 32];
            let weight = lattice3::group_weights(xb, qw.map(|q| &q[32 * ib..32 * ib + 32]), sigma2);
            let Some(g) = lattice3::quantize_group(lat, Variant::Xxs, xb, &weight) else {
                continue;
            };
            for (k, &i) in g.index.iter().enumerate() {
                q3[8 * ib + k] = i as u8;
            }
            scale_signs[ib] = (0..4).fold(0, |a, k| a | ((g.signs[k] as u32) << (7 * k)));
            scales[ib] = g.scale;
            max_scale = if max_scale > g.scale {
                max_scale
            } else {
                g.scale
            };
        }
        let mut b = BlockIQ3XXS { d: 0, qs: [0; 96] };
        if max_scale == 0.0 {
            return b;
        }
        let d = max_scale / 31.0;
        b.d = f16_from_f32(d * 1.0125);
        let id = 1.0 / d;
        for (ib, s) in scale_signs.iter_mut().enumerate() {
            *s |= (lattice3::scale_code(id, scales[ib]) as u32) << 28;
        }
        b.qs[..64].copy_from_slice(&q3);
        for (ib, s) in scale_signs.iter().enumerate() {
            b.qs[64 + 4 * ib..68 + 4 * ib].copy_from_slice(&s.to_le_bytes());
        }
        b
    }
}

impl BlockFormat for BlockIQ3XXS {
    const TYPE: GgmlType = GgmlType::IQ3_XXS;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        Self::quantize_row_imatrix(x, None, out);
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * QK_K, "dequantize: output length");
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f32_from_f16(b.d);
            for (ib, y) in y.chunks_exact_mut(32).enumerate() {
                let db = d * (0.5 + (b.scale_signs(ib) >> 28) as f32) * 0.5;
                for (yi, v) in y.iter_mut().zip(b.values(ib)) {
                    // ggml: db · |grid| · (±1).
                    let s = if v < 0 { -1.0 } else { 1.0 };
                    *yi = db * v.abs() as f32 * s;
                }
            }
        }
    }

    /// ggml's generic kernel: per sub-block an exact i32 sum times `2·scale + 1`, per block
    /// `sumf += d·bsum`, and the row's sum times 0.25.
    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        assert_eq!(w.len(), a.len(), "vec_dot: rows differ in length");
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = f32_from_f16(x.d) * y.d;
            let mut bsum = 0i32;
            for ib in 0..8 {
                let ls = 2 * (x.scale_signs(ib) >> 28) as i32 + 1;
                let q8 = &y.qs[32 * ib..32 * ib + 32];
                let sumi: i32 = x
                    .values(ib)
                    .iter()
                    .zip(q8)
                    .map(|(&v, &q)| v * q as i32)
                    .sum();
                bsum += sumi * ls;
            }
            sumf += d * bsum as f32;
        }
        0.25 * sumf
    }
}

impl ImatrixQuantize for BlockIQ3XXS {
    const NEEDS_IMATRIX: bool = true;

    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        assert_eq!(x.len(), out.len() * QK_K, "quantize: input length");
        if let Some(qw) = qw {
            assert_eq!(qw.len(), x.len(), "quantize: importance weights length");
        }
        for (ibl, b) in out.iter_mut().enumerate() {
            let r = QK_K * ibl..QK_K * (ibl + 1);
            *b = Self::quantize_block(&x[r.clone()], qw.map(|q| &q[r]));
        }
    }
}
