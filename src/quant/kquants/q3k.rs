//! Q3_K: 16 sub-blocks of 16, `y = d·(u−32)·(q−4)` with 3-bit `q` and 6-bit `u` (§3.10, §4.6).

use super::search::{
    make_q3_quants, make_qx_quants_weighted, sigma_weights, sum_in_order, sum_squares,
};
use super::*;
use crate::quant::{BlockFormat, GgmlType, ImatrixQuantize};
use bytemuck::Zeroable;

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ3K {
    /// Third bit of each quant: element `e` in bit `e / 32` of byte `e % 32`.
    pub hmask: [u8; 32],
    /// Low 2 bits, layout of `pack_2bit`.
    pub qs: [u8; 64],
    /// 16 six-bit scales with bias 32 (`pack_q3_scales`).
    pub scales: [u8; 12],
    /// f16 super-scale.
    pub d: u16,
}

/// Q3_K scale packing: low nibbles of scales 0–7 in the low nibbles of bytes 0–7, of scales 8–15 in
/// their high nibbles; the top 2 bits of scale `k` in bits `2·(k/4)` of byte `8 + k%4`.
pub(super) fn pack_q3_scales(u: &[u8; 16]) -> [u8; 12] {
    let mut b = [0u8; 12];
    for (k, &v) in u.iter().enumerate() {
        b[k % 8] |= (v & 0xF) << (4 * (k / 8));
        b[8 + k % 4] |= (v >> 4) << (2 * (k / 4));
    }
    b
}

/// The 16 signed scales `u − 32` in −32..=31.
fn unpack_q3_scales(b: &[u8; 12]) -> [i32; 16] {
    std::array::from_fn(|k| {
        let low = (b[k % 8] >> (4 * (k / 8))) & 0xF;
        let high = (b[8 + k % 4] >> (2 * (k / 4))) & 3;
        (low | (high << 4)) as i32 - 32
    })
}

impl BlockQ3K {
    fn quantize_block(x: &[f32]) -> Self {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for k in 0..16 {
            scales[k] = make_q3_quants(4, &x[16 * k..16 * k + 16], &mut l[16 * k..16 * k + 16]);
            if scales[k].abs() > amax {
                amax = scales[k].abs();
                max_scale = scales[k];
            }
        }

        let mut b = BlockQ3K::zeroed();
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            // ggml narrows the int to int8_t before clamping.
            let u: [u8; 16] = std::array::from_fn(|k| {
                ((nearest_int(iscale * scales[k]) as i8).clamp(-32, 31) + 32) as u8
            });
            b.scales = pack_q3_scales(&u);
            b.d = f16_from_f32(1.0 / iscale);
        }

        Self::finish(x, b, l)
    }

    /// ggml's `quantize_row_q3_K_impl` for one super-block: weighted `make_qx_quants` per sub-block, and
    /// the 6-bit scales by a second `make_qx_quants` weighted by the sub-blocks' total weights.
    fn quantize_block_weighted(x: &[f32], qw: &[f32]) -> Self {
        let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
        let mut l = [0u8; QK_K];
        let (mut scales, mut sw) = ([0.0f32; 16], [0.0f32; 16]);
        for j in 0..16 {
            let xj = &x[16 * j..16 * j + 16];
            let w: [f32; 16] = sigma_weights(sigma2, xj, &qw[16 * j..]);
            sw[j] = sum_in_order(&w);
            scales[j] = make_qx_quants_weighted(4, xj, &w, &mut l[16 * j..16 * j + 16]);
        }
        let mut ls = [0u8; 16];
        let d_block = make_qx_quants_weighted(32, &scales, &sw, &mut ls);
        let mut b = BlockQ3K::zeroed();
        b.scales = pack_q3_scales(&ls);
        b.d = f16_from_f32(d_block);
        Self::finish(x, b, l)
    }

    /// Re-quantizes with the decoded scales (a zero-scale sub-block keeps its search-phase quants) and packs.
    fn finish(x: &[f32], mut b: Self, mut l: [u8; QK_K]) -> Self {
        let d = f32_from_f16(b.d);
        for (k, &sc) in unpack_q3_scales(&b.scales).iter().enumerate() {
            let dk = d * sc as f32;
            if dk == 0.0 {
                continue;
            }
            for i in 16 * k..16 * k + 16 {
                l[i] = (nearest_int(x[i] / dk).clamp(-4, 3) + 4) as u8;
            }
        }

        for (e, le) in l.iter_mut().enumerate() {
            if *le > 3 {
                b.hmask[e % 32] |= 1 << (e / 32);
                *le -= 4;
            }
        }
        b.qs = pack_2bit(&l);
        b
    }

    /// Signed quants `q − 4` in element order, −4..=3.
    fn quants(&self) -> [i8; QK_K] {
        std::array::from_fn(|e| {
            let high = (self.hmask[e % 32] >> (e / 32)) & 1;
            (unpack_2bit(&self.qs, e) | (high << 2)) as i8 - 4
        })
    }
}

impl ImatrixQuantize for BlockQ3K {
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        match qw {
            None => Self::quantize(x, out),
            Some(qw) => weighted_blocks(x, qw, out, Self::quantize_block_weighted),
        }
    }
}

impl BlockFormat for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, Self::quantize_block);
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        dequantize_blocks(blocks, out, |b, y| {
            let d = f32_from_f16(b.d);
            let q = b.quants();
            for (k, &sc) in unpack_q3_scales(&b.scales).iter().enumerate() {
                let dl = d * sc as f32;
                for e in 16 * k..16 * k + 16 {
                    y[e] = dl * q[e] as f32;
                }
            }
        });
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        dot_lanes(w, a, |x, y| BlockDot {
            d: f32_from_f16(x.d) * y.d,
            lanes: lane_sums(&x.quants(), &unpack_q3_scales(&x.scales), &y.qs),
            min: 0.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_packing_round_trips() {
        for v in 0..64u8 {
            let u: [u8; 16] = std::array::from_fn(|k| (v + 5 * k as u8) % 64);
            let sc = unpack_q3_scales(&pack_q3_scales(&u));
            assert_eq!(sc, std::array::from_fn(|k| u[k] as i32 - 32), "v = {v}");
        }
    }

    #[test]
    fn scale_layout_matches_spec() {
        // Scale 9 = 0b10_0110: low nibble in the high nibble of byte 1, top bits in bits 4–5 of byte 9.
        let mut u = [0u8; 16];
        u[9] = 0b10_0110;
        let b = pack_q3_scales(&u);
        let mut want = [0u8; 12];
        want[1] = 0x60;
        want[9] = 0b10 << 4;
        assert_eq!(b, want);
    }
}
