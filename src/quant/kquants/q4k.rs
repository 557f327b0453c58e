//! Q4_K: 8 sub-blocks of 32, `y = d·S·q − dmin·M` with 4-bit `q` and 6-bit `S`, `M` (§3.11, §4.6).

use super::search::MinSearch;
use super::*;
use crate::quant::{BlockFormat, GgmlType, ImatrixQuantize};

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4K {
    /// f16 super-scale of the scales.
    pub d: u16,
    /// f16 super-scale of the mins.
    pub dmin: u16,
    /// 8 scales and 8 mins, 6 bits each (`pack_scale_min`).
    pub scales: [u8; 12],
    /// Byte `32c + l`: element `64c + l` in the low nibble, `64c + 32 + l` in the high nibble.
    pub qs: [u8; 128],
}

const SEARCH: MinSearch = MinSearch {
    nmax: 15,
    rmin: -1.0,
    rdelta: 0.1,
    nstep: 20,
    use_mad: false,
};

impl BlockQ4K {
    fn quantize_block(x: &[f32]) -> Self {
        Self::pack(quantize_scale_min(x, &SEARCH))
    }

    fn quantize_block_weighted(x: &[f32], qw: &[f32]) -> Self {
        Self::pack(quantize_scale_min_weighted(x, qw, 15, false))
    }

    fn pack(ScaleMinBlock { d, dmin, scales, l }: ScaleMinBlock) -> Self {
        let qs = std::array::from_fn(|i| {
            let e = 64 * (i / 32) + i % 32;
            l[e] | (l[e + 32] << 4)
        });
        BlockQ4K {
            d,
            dmin,
            scales,
            qs,
        }
    }

    /// Quants in element order, 0..=15.
    fn quants(&self) -> [i8; QK_K] {
        std::array::from_fn(|e| {
            let byte = self.qs[32 * (e / 64) + e % 32];
            (if e % 64 < 32 { byte & 0xF } else { byte >> 4 }) as i8
        })
    }
}

/// Dequantizes a Q4_K or Q5_K block from its unpacked quants: `y = (d·S)·q − dmin·M`.
pub(super) fn dequantize_scale_min(
    d: u16,
    dmin: u16,
    scales: &[u8; 12],
    q: &[i8; QK_K],
    y: &mut [f32],
) {
    let (d, dmin) = (f32_from_f16(d), f32_from_f16(dmin));
    let (s, m) = unpack_scale_min(scales);
    for k in 0..8 {
        let d1 = d * s[k] as f32;
        let m1 = dmin * m[k] as f32;
        for e in 32 * k..32 * k + 32 {
            y[e] = d1 * q[e] as f32 - m1;
        }
    }
}

/// One Q4_K/Q5_K block in ggml's generic kernel: lanes of `S·q·qy`, mins through the Q8_K bsums.
pub(super) fn dot_scale_min(
    d: u16,
    dmin: u16,
    scales: &[u8; 12],
    q: &[i8; QK_K],
    y: &BlockQ8K,
) -> BlockDot {
    let (s, m) = unpack_scale_min(scales);
    let mut sumi = 0i32;
    for (j, &bs) in y.bsums.iter().enumerate() {
        sumi += bs as i32 * m[j / 2] as i32;
    }
    BlockDot {
        d: f32_from_f16(d) * y.d,
        lanes: lane_sums(q, &s.map(i32::from), &y.qs),
        min: f32_from_f16(dmin) * y.d * sumi as f32,
    }
}

impl ImatrixQuantize for BlockQ4K {
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        match qw {
            None => Self::quantize(x, out),
            Some(qw) => weighted_blocks(x, qw, out, Self::quantize_block_weighted),
        }
    }
}

impl BlockFormat for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
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
