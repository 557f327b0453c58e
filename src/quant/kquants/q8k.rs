//! Q8_K: the activation format of the K-quants, `y = d·q` with f32 `d` and 16-element sums (§3.14, §4.8).

use super::search::abs_max;
use super::*;
use crate::quant::{BlockFormat, GgmlType};
use bytemuck::Zeroable;

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8K {
    /// f32 scale; negative when the largest-magnitude input is positive.
    pub d: f32,
    /// Quants in −127..=127.
    pub qs: [i8; 256],
    /// `bsums[j] = Σ qs[16j..16j+16]`, so kernels can apply weight mins per sub-block.
    pub bsums: [i16; 16],
}

impl BlockQ8K {
    fn quantize_block(x: &[f32]) -> Self {
        let (amax, max) = abs_max(x);
        if amax == 0.0 {
            // ggml leaves bsums unwritten here; zero is the only sensible value.
            return BlockQ8K::zeroed();
        }
        // −127 (not −128) keeps every quant in −127..=127.
        let iscale = -127.0 / max;
        let qs: [i8; QK_K] = std::array::from_fn(|e| nearest_int(iscale * x[e]).min(127) as i8);
        let bsums = std::array::from_fn(|j| {
            qs[16 * j..16 * j + 16]
                .iter()
                .map(|&q| q as i32)
                .sum::<i32>() as i16
        });
        BlockQ8K {
            d: 1.0 / iscale,
            qs,
            bsums,
        }
    }
}

impl BlockFormat for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8_K;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_blocks(x, out, Self::quantize_block);
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        dequantize_blocks(blocks, out, |b, y| {
            for (yi, &q) in y.iter_mut().zip(&b.qs) {
                *yi = b.d * q as f32;
            }
        });
    }

    /// ggml has no Q8_K × Q8_K kernel; this follows its Q8_0 × Q8_0 pattern: `sumf += isum·(dx·dy)`.
    fn vec_dot_ref(w: &[Self], a: &[Self]) -> f32 {
        assert_eq!(w.len(), a.len(), "vec_dot: rows differ in length");
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let isum: i32 = lane_sums(&x.qs, &[1], &y.qs).iter().sum();
            sumf += isum as f32 * (x.d * y.d);
        }
        sumf
    }
}
