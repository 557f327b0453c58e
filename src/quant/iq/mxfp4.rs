//! MXFP4 (OCP microscaling): 32 E2M1 values sharing an E8M0 exponent. ggml stores the E2M1 levels doubled
//! (`KVALUES_MXFP4`) and halves the scale instead (`ggml_e8m0_to_fp32_half`).

use super::blocks::{BlockMXFP4, QK_MXFP4};
use crate::quant::{f32_from_f16, BlockFormat, BlockQ8_0, GgmlType};

/// The E2M1 values times 2, by code (bit 3 is the sign).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e − 128)`, i.e. half the E8M0 scale, as ggml builds it from bits (subnormal for e < 2).
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e as u32) - 1) << 23
    };
    f32::from_bits(bits)
}

/// The code whose level times `d` is nearest to `x`, the first on ties (`best_index_mxfp4`).
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// The shared exponent of a block: `floor(log2(amax)) − 2 + 127` as C converts it to a byte, 0 for zeros.
fn exponent(x: &[f32]) -> u8 {
    let mut amax = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
        }
    }
    if amax > 0.0 {
        (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
    } else {
        0
    }
}

fn check_len(n: usize, blocks: usize) {
    assert_eq!(n, blocks * QK_MXFP4, "MXFP4: not a whole number of blocks");
}

impl BlockFormat for BlockMXFP4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const BLOCK: usize = QK_MXFP4;
    type VecDot = BlockQ8_0;

    /// `quantize_row_mxfp4_ref` (llama-quantize's MXFP4 quantizer too: it ignores an importance matrix).
    fn quantize(x: &[f32], out: &mut [Self]) {
        check_len(x.len(), out.len());
        for (o, x) in out.iter_mut().zip(x.chunks_exact(QK_MXFP4)) {
            let e = exponent(x);
            let d = e8m0_to_f32_half(e);
            let mut qs = [0u8; QK_MXFP4 / 2];
            for (j, q) in qs.iter_mut().enumerate() {
                *q = best_index(x[j], d) | (best_index(x[j + QK_MXFP4 / 2], d) << 4);
            }
            *o = BlockMXFP4 { e, qs };
        }
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        check_len(out.len(), blocks.len());
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_MXFP4)) {
            let d = e8m0_to_f32_half(b.e);
            for (j, &q) in b.qs.iter().enumerate() {
                y[j] = KVALUES_MXFP4[(q & 0xf) as usize] as f32 * d;
                y[j + QK_MXFP4 / 2] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
            }
        }
    }

    /// `ggml_vec_dot_mxfp4_q8_0_generic`: per block (d8·d)·isum, summed in block order.
    fn vec_dot_ref(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        assert_eq!(
            w.len(),
            a.len(),
            "weight and activation block counts differ"
        );
        let mut sum = 0f32;
        for (x, y) in w.iter().zip(a) {
            let d = f32_from_f16(y.d) * e8m0_to_f32_half(x.e);
            let mut isum = 0i32;
            for (j, &q) in x.qs.iter().enumerate() {
                isum += y.qs[j] as i32 * KVALUES_MXFP4[(q & 0xf) as usize] as i32;
                isum += y.qs[j + 16] as i32 * KVALUES_MXFP4[(q >> 4) as usize] as i32;
            }
            sum += d * isum as f32;
        }
        sum
    }
}
