//! IQ3_S: 256 values as 64 points of the 512-point 3-bit lattice (9-bit indices: low 8 bits in `qs`,
//! the ninth in `qh`), an explicit sign bit per value and a 4-bit scale per 32 values; 3.44 bpw.

use super::grids::IQ3S_GRID;
use super::lattice3::{self, Variant};
use super::BlockIQ3S;
use crate::quant::{
    f16_from_f32, f32_from_f16, BlockFormat, BlockQ8K, GgmlType, ImatrixQuantize, QK_K,
};
use bytemuck::Zeroable;

impl BlockIQ3S {
    /// Sub-block `ib`'s odd scale `2·s + 1`.
    fn scale(&self, ib: usize) -> i32 {
        2 * ((self.scales[ib / 2] >> (4 * (ib % 2))) & 0xF) as i32 + 1
    }

    /// Sub-block `ib`'s 32 values as signed grid values (before the scales).
    fn values(&self, ib: usize) -> [i32; 32] {
        std::array::from_fn(|e| {
            let (p, j) = (e / 4, e % 4);
            let index = self.qs[8 * ib + p] as usize | ((((self.qh[ib] >> p) & 1) as usize) << 8);
            let g = ((IQ3S_GRID[index] >> (8 * j)) & 0xFF) as i32;
            if self.signs[4 * ib + e / 8] & (1 << (e % 8)) != 0 {
                -g
            } else {
                g
            }
        })
    }

    /// ggml's `quantize_row_iq3_s_impl` for one super-block, `qw` its 256 importance weights.
    fn quantize_block(x: &[f32], qw: Option<&[f32]>) -> Self {
        let lat = lattice3::iq3s();
        let sigma2 = lattice3::sigma2(x);
        let mut b = BlockIQ3S::zeroed();
        let mut scales = [0.0f32; 8];
        let mut max_scale = 0.0f32;
        // ggml advances its `qs` and `signs` cursors only past sub-blocks it quantized, so a zero
        // sub-block shifts the codes of the later ones down (`qh` is indexed by sub-block). Kept as is:
        // the files llama-quantize writes are laid out that way.
        let (mut qs_at, mut signs_at) = (0, 0);
        for ib in 0..8 {
            let xb = &x[32 * ib..32 * ib + 32];
            let weight = lattice3::group_weights(xb, qw.map(|q| &q[32 * ib..32 * ib + 32]), sigma2);
            let Some(g) = lattice3::quantize_group(lat, Variant::S, xb, &weight) else {
                continue;
            };
            for (k, &i) in g.index.iter().enumerate() {
                b.qs[qs_at + k] = i as u8;
                b.qh[ib] |= ((i >> 8) as u8) << k;
            }
            qs_at += 8;
            b.signs[signs_at..signs_at + 4].copy_from_slice(&g.signs);
            signs_at += 4;
            scales[ib] = g.scale;
            max_scale = if max_scale > g.scale {
                max_scale
            } else {
                g.scale
            };
        }
        if max_scale == 0.0 {
            return b;
        }
        let d = max_scale / 31.0;
        b.d = f16_from_f32(d * 1.033);
        let id = 1.0 / d;
        for (i, s) in b.scales.iter_mut().enumerate() {
            let l1 = lattice3::scale_code(id, scales[2 * i]);
            let l2 = lattice3::scale_code(id, scales[2 * i + 1]);
            *s = l1 | (l2 << 4);
        }
        b
    }
}

impl BlockFormat for BlockIQ3S {
    const TYPE: GgmlType = GgmlType::IQ3_S;
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
                let db = d * b.scale(ib) as f32;
                for (yi, v) in y.iter_mut().zip(b.values(ib)) {
                    // ggml: db · |grid| · (±1).
                    let s = if v < 0 { -1.0 } else { 1.0 };
                    *yi = db * v.abs() as f32 * s;
                }
            }
        }
    }

    /// ggml's generic kernel: per sub-block an exact i32 sum times `2·scale + 1`, per block
    /// `sumf += d·bsum`.
    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        assert_eq!(w.len(), a.len(), "vec_dot: rows differ in length");
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = f32_from_f16(x.d) * y.d;
            let mut bsum = 0i32;
            for ib in 0..8 {
                let q8 = &y.qs[32 * ib..32 * ib + 32];
                let sumi: i32 = x
                    .values(ib)
                    .iter()
                    .zip(q8)
                    .map(|(&v, &q)| v * q as i32)
                    .sum();
                bsum += sumi * x.scale(ib);
            }
            sumf += d * bsum as f32;
        }
        sumf
    }
}

impl ImatrixQuantize for BlockIQ3S {
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
