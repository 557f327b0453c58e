//! Q6_K: 16 sub-blocks of 16, `y = (d·sc)·(q−32)` with 6-bit `q` and i8 `sc` (§3.13, §4.6).

use super::search::{make_qx_quants, make_qx_quants_weighted, GROUP_MAX_EPS};
use super::*;
use crate::quant::{BlockFormat, GgmlType, ImatrixQuantize};
use bytemuck::Zeroable;

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits. In half `h`: byte `64h + l` holds elements `128h + l` (low nibble) and `128h + 64 + l`
    /// (high nibble); byte `64h + 32 + l` holds `128h + 32 + l` and `128h + 96 + l`.
    pub ql: [u8; 128],
    /// High 2 bits: byte `32h + l` holds elements `128h + l + 32j` in bits `2j..2j+2`.
    pub qh: [u8; 64],
    /// Signed scale per 16-element sub-block.
    pub scales: [i8; 16],
    /// f16 super-scale.
    pub d: u16,
}

impl BlockQ6K {
    fn quantize_block(x: &[f32]) -> Self {
        Self::quantize_block_with(x, |xk, _, lk| make_qx_quants(32, xk, lk))
    }

    /// ggml's `quantize_row_q6_K_impl`: the importance weights go to `make_qx_quants` as they are (no
    /// sigma2 term for Q6_K).
    fn quantize_block_weighted(x: &[f32], qw: &[f32]) -> Self {
        Self::quantize_block_with(x, |xk, k, lk| {
            make_qx_quants_weighted(32, xk, &qw[16 * k..16 * k + 16], lk)
        })
    }

    /// Both Q6_K quantizers; `search(x_k, k, L_k)` returns sub-block `k`'s scale.
    fn quantize_block_with(x: &[f32], search: impl Fn(&[f32], usize, &mut [u8]) -> f32) -> Self {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for k in 0..16 {
            scales[k] = search(&x[16 * k..16 * k + 16], k, &mut l[16 * k..16 * k + 16]);
            if scales[k].abs() > max_abs_scale {
                max_abs_scale = scales[k].abs();
                max_scale = scales[k];
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            return BlockQ6K::zeroed();
        }

        let iscale = -128.0 / max_scale;
        let d = f16_from_f32(1.0 / iscale);
        // The largest sub-block scale maps to exactly −128; `as i8` is ggml's int-to-int8_t store.
        let sc: [i8; 16] = std::array::from_fn(|k| nearest_int(iscale * scales[k]).min(127) as i8);

        // Re-quantize with the rounded scales; a zero-scale sub-block keeps its search-phase quants.
        for (k, &s) in sc.iter().enumerate() {
            let dk = f32_from_f16(d) * s as f32;
            if dk == 0.0 {
                continue;
            }
            for i in 16 * k..16 * k + 16 {
                l[i] = (nearest_int(x[i] / dk).clamp(-32, 31) + 32) as u8;
            }
        }

        let mut b = BlockQ6K {
            ql: [0; 128],
            qh: [0; 64],
            scales: sc,
            d,
        };
        for h in 0..2 {
            let lh = &l[128 * h..128 * h + 128];
            for i in 0..32 {
                b.ql[64 * h + i] = (lh[i] & 0xF) | ((lh[i + 64] & 0xF) << 4);
                b.ql[64 * h + 32 + i] = (lh[i + 32] & 0xF) | ((lh[i + 96] & 0xF) << 4);
                b.qh[32 * h + i] = (lh[i] >> 4)
                    | ((lh[i + 32] >> 4) << 2)
                    | ((lh[i + 64] >> 4) << 4)
                    | ((lh[i + 96] >> 4) << 6);
            }
        }
        b
    }

    /// Signed quants `q − 32` in element order, −32..=31.
    fn quants(&self) -> [i8; QK_K] {
        std::array::from_fn(|e| {
            let (h, r) = (e / 128, e % 128);
            let low = (self.ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
            let high = (self.qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            (low | (high << 4)) as i8 - 32
        })
    }
}

impl ImatrixQuantize for BlockQ6K {
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        match qw {
            None => Self::quantize(x, out),
            Some(qw) => weighted_blocks(x, qw, out, Self::quantize_block_weighted),
        }
    }
}

impl BlockFormat for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, Self::quantize_block);
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        dequantize_blocks(blocks, out, |b, y| {
            let d = f32_from_f16(b.d);
            let q = b.quants();
            for e in 0..QK_K {
                // ggml's order, (d·sc)·q; every product here is exact anyway (f16 d, 7+5-bit ints).
                y[e] = d * b.scales[e / 16] as f32 * q[e] as f32;
            }
        });
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        dot_lanes(w, a, |x, y| BlockDot {
            d: f32_from_f16(x.d) * y.d,
            lanes: lane_sums(&x.quants(), &x.scales.map(i32::from), &y.qs),
            min: 0.0,
        })
    }
}
