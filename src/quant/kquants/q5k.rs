//! Q5_K: as Q4_K with a fifth quant bit, `q` in 0..=31 (§3.12, §4.6).

use super::q4k::{dequantize_scale_min, dot_scale_min};
use super::search::MinSearch;
use super::*;
use crate::quant::{BlockFormat, GgmlType, ImatrixQuantize};

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5K {
    /// f16 super-scale of the scales.
    pub d: u16,
    /// f16 super-scale of the mins.
    pub dmin: u16,
    /// 8 scales and 8 mins, 6 bits each (`pack_scale_min`).
    pub scales: [u8; 12],
    /// Fifth bit of element `e` in bit `e / 32` of byte `e % 32`.
    pub qh: [u8; 32],
    /// Low 4 bits, laid out as Q4_K's `qs`.
    pub qs: [u8; 128],
}

const SEARCH: MinSearch = MinSearch {
    nmax: 31,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: false,
};

impl BlockQ5K {
    fn quantize_block(x: &[f32]) -> Self {
        Self::pack(quantize_scale_min(x, &SEARCH))
    }

    fn quantize_block_weighted(x: &[f32], qw: &[f32]) -> Self {
        Self::pack(quantize_scale_min_weighted(x, qw, 31, true))
    }

    fn pack(ScaleMinBlock { d, dmin, scales, l }: ScaleMinBlock) -> Self {
        let mut qh = [0u8; 32];
        for (e, &le) in l.iter().enumerate() {
            qh[e % 32] |= (le >> 4) << (e / 32);
        }
        let qs = std::array::from_fn(|i| {
            let e = 64 * (i / 32) + i % 32;
            (l[e] & 0xF) | ((l[e + 32] & 0xF) << 4)
        });
        BlockQ5K {
            d,
            dmin,
            scales,
            qh,
            qs,
        }
    }

    /// Quants in element order, 0..=31.
    fn quants(&self) -> [i8; QK_K] {
        std::array::from_fn(|e| {
            let byte = self.qs[32 * (e / 64) + e % 32];
            let low = if e % 64 < 32 { byte & 0xF } else { byte >> 4 };
            let high = (self.qh[e % 32] >> (e / 32)) & 1;
            (low | (high << 4)) as i8
        })
    }
}

impl ImatrixQuantize for BlockQ5K {
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        match qw {
            None => Self::quantize(x, out),
            Some(qw) => weighted_blocks(x, qw, out, Self::quantize_block_weighted),
        }
    }
}

impl BlockFormat for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, Self::quantize_block);
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        dequantize_blocks(blocks, out, |b, y| {
            dequantize_scale_min(b.d, b.dmin, &b.scales, &b.quants(), y)
        });
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        dot_lanes(w, a, |x, y| {
            dot_scale_min(x.d, x.dmin, &x.scales, &x.quants(), y)
        })
    }
}
