//! Q2_K: 16 sub-blocks of 16, `y = d·sc·q − dmin·m` with 2-bit `q` and 4-bit `sc`, `m` (§3.9, §4.6).

use super::search::{
    make_qkx2_quants, make_qkx3_quants, make_qp_quants, sigma_weights, sum_in_order, sum_squares,
    MinSearch,
};
use super::*;
use crate::quant::{BlockFormat, GgmlType, ImatrixQuantize};
use bytemuck::Zeroable;

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ2K {
    /// Low nibble: scale of sub-block k; high nibble: its min.
    pub scales: [u8; 16],
    /// 2-bit quants, layout of `pack_2bit`.
    pub qs: [u8; 64],
    /// f16 super-scale of the scales.
    pub d: u16,
    /// f16 super-scale of the mins.
    pub dmin: u16,
}

const SEARCH: MinSearch = MinSearch {
    nmax: 3,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: true,
};

impl BlockQ2K {
    fn quantize_block(x: &[f32]) -> Self {
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins) = ([0.0f32; 16], [0.0f32; 16]);
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for k in 0..16 {
            let xk = &x[16 * k..16 * k + 16];
            let w: [f32; 16] = std::array::from_fn(|i| xk[i].abs());
            (scales[k], mins[k]) = make_qkx2_quants(&SEARCH, xk, &w, &mut l[16 * k..16 * k + 16]);
            if scales[k] > max_scale {
                max_scale = scales[k];
            }
            if mins[k] > max_min {
                max_min = mins[k];
            }
        }

        let mut b = BlockQ2K::zeroed();
        // The `as u8` truncations mirror ggml's int-to-uint8_t stores.
        if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for (sc, &s) in b.scales.iter_mut().zip(&scales) {
                *sc = nearest_int(iscale * s) as u8;
            }
            b.d = f16_from_f32(max_scale / 15.0);
        }
        if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for (sc, &m) in b.scales.iter_mut().zip(&mins) {
                *sc |= (nearest_int(iscale * m) << 4) as u8;
            }
            b.dmin = f16_from_f32(max_min / 15.0);
        }

        // Re-quantize with the rounded scales; a zero-scale sub-block keeps its search-phase quants.
        for k in 0..16 {
            let dk = f32_from_f16(b.d) * (b.scales[k] & 0xF) as f32;
            if dk == 0.0 {
                continue;
            }
            let mk = f32_from_f16(b.dmin) * (b.scales[k] >> 4) as f32;
            for i in 16 * k..16 * k + 16 {
                l[i] = nearest_int((x[i] + mk) / dk).clamp(0, 3) as u8;
            }
        }
        b.qs = pack_2bit(&l);
        b
    }

    /// ggml's `quantize_row_q2_K_impl` for one super-block: weighted min/scale searches per sub-block,
    /// then the 4-bit scales and mins by `make_qp_quants` weighted by the sub-blocks' total weights.
    fn quantize_block_weighted(x: &[f32], qw: &[f32]) -> Self {
        let sigma2 = sum_squares(x) / QK_K as f32;
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins, mut sw) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
        for j in 0..16 {
            let xj = &x[16 * j..16 * j + 16];
            let w: [f32; 16] = sigma_weights(sigma2, xj, &qw[16 * j..]);
            sw[j] = sum_in_order(&w);
            (scales[j], mins[j]) = make_qkx3_quants(3, xj, &w, &mut l[16 * j..16 * j + 16]);
        }
        let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
        let dm = make_qp_quants(15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(15, &mins, &mut lm, &sw);

        let mut b = BlockQ2K::zeroed();
        b.d = f16_from_f32(dm);
        b.dmin = f16_from_f32(mm);
        let (dm, mm) = (f32_from_f16(b.d), f32_from_f16(b.dmin));
        for ((sc, &s), &m) in b.scales.iter_mut().zip(&ls).zip(&lm) {
            *sc = s | (m << 4);
        }
        for j in 0..16 {
            let d = dm * (b.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let m = mm * (b.scales[j] >> 4) as f32;
            for i in 16 * j..16 * j + 16 {
                l[i] = nearest_int((x[i] + m) / d).clamp(0, 3) as u8;
            }
        }
        b.qs = pack_2bit(&l);
        b
    }

    /// Quants in element order, 0..=3.
    fn quants(&self) -> [i8; QK_K] {
        std::array::from_fn(|e| unpack_2bit(&self.qs, e) as i8)
    }
}

impl ImatrixQuantize for BlockQ2K {
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        match qw {
            None => Self::quantize(x, out),
            Some(qw) => weighted_blocks(x, qw, out, Self::quantize_block_weighted),
        }
    }
}

impl BlockFormat for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, Self::quantize_block);
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        dequantize_blocks(blocks, out, |b, y| {
            let (d, dmin) = (f32_from_f16(b.d), f32_from_f16(b.dmin));
            let q = b.quants();
            for (k, &sc) in b.scales.iter().enumerate() {
                let dl = d * (sc & 0xF) as f32;
                let ml = dmin * (sc >> 4) as f32;
                for e in 16 * k..16 * k + 16 {
                    y[e] = dl * q[e] as f32 - ml;
                }
            }
        });
    }

    /// ggml's generic kernel: one i32 sum per block, `dall·isum − dmin·summs` added to a single f32.
    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        assert_eq!(
            w.len(),
            a.len(),
            "vec_dot: weight and activation rows differ in length"
        );
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let mut summs = 0i32;
            for (&bs, &sc) in y.bsums.iter().zip(&x.scales) {
                summs += bs as i32 * (sc >> 4) as i32;
            }
            let scales: [i32; 16] = std::array::from_fn(|k| (x.scales[k] & 0xF) as i32);
            let isum: i32 = lane_sums(&x.quants(), &scales, &y.qs).iter().sum();
            let dall = y.d * f32_from_f16(x.d);
            let dmin = y.d * f32_from_f16(x.dmin);
            sumf += dall * isum as f32 - dmin * summs as f32;
        }
        sumf
    }
}
