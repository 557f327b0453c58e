//! TQ1_0 and TQ2_0: ternary values {-1, 0, 1}·d (BitNet b1.58, TriLM), 256 per block with an f16 scale.
//!
//! TQ1_0 packs five trits per byte as a base-3 fraction of 256 (`⌈q·256/243⌉`, so a trit is read back by
//! multiplying by a power of 3 and taking the top bits of `3·byte`); TQ2_0 stores `q + 1` in 2 bits. The
//! quantizers (`quantize_row_tq*_0_ref`, also what llama-quantize runs: these formats ignore an importance
//! matrix) round `x/amax` half away from zero.

use super::blocks::{BlockTQ1_0, BlockTQ2_0};
use crate::quant::{f16_from_f32, f32_from_f16, BlockFormat, BlockQ8K, GgmlType, QK_K};

/// Bytes of `qs` holding five trits each, in groups of 32 then 16 (48 bytes: 240 values).
const QS: usize = (QK_K - 4 * QK_K / 64) / 5;
/// Bytes of `qh` holding four trits each (16 values).
const QH: usize = QK_K / 64;

/// `amax` of a block (ggml's `MAX(amax, fabsf(v))`) and its reciprocal (0 for an all-zero block).
fn scale(x: &[f32]) -> (f32, f32) {
    let mut amax = 0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    (amax, if amax != 0.0 { 1.0 / amax } else { 0.0 })
}

/// `lroundf(x·id) + 1`: the trit 0, 1 or 2 of a value.
fn trit(x: f32, id: f32) -> u8 {
    ((x * id).round() as i32 + 1) as u8
}

/// `trits` (most significant first) as a base-3 number, scaled to a byte by ceiling division.
fn pack_trits(trits: impl Iterator<Item = u8>) -> u8 {
    let q = trits.fold(0u8, |q, t| q.wrapping_mul(3).wrapping_add(t));
    (q as u16 * 256).div_ceil(243) as u8
}

/// The trit at power `p` of a packed byte, as −1, 0 or 1.
fn unpack_trit(byte: u8, p: usize) -> i8 {
    let q = byte.wrapping_mul(3u8.pow(p as u32));
    (((q as u16) * 3) >> 8) as i8 - 1
}

/// The 256 ternary values of a TQ1_0 block in element order.
fn tq1_values(b: &BlockTQ1_0) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    let mut base = 0;
    for (start, width) in [(0usize, 32usize), (32, 16)] {
        for n in 0..5 {
            for (m, &q) in b.qs[start..start + width].iter().enumerate() {
                v[base + n * width + m] = unpack_trit(q, n);
            }
        }
        base += 5 * width;
    }
    for n in 0..4 {
        for (j, &q) in b.qh.iter().enumerate() {
            v[base + n * QH + j] = unpack_trit(q, n);
        }
    }
    v
}

/// The 256 ternary values of a TQ2_0 block in element order.
fn tq2_values(b: &BlockTQ2_0) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for (j, qs) in b.qs.chunks_exact(32).enumerate() {
        for l in 0..4 {
            for (m, &q) in qs.iter().enumerate() {
                v[128 * j + 32 * l + m] = ((q >> (2 * l)) & 3) as i8 - 1;
            }
        }
    }
    v
}

fn check_len(ty: GgmlType, n: usize, blocks: usize) {
    assert_eq!(n, blocks * QK_K, "{ty}: not a whole number of blocks");
}

fn dequantize_with<B>(blocks: &[B], out: &mut [f32], f: impl Fn(&B) -> (u16, [i8; QK_K])) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, v) = f(b);
        let d = f32_from_f16(d);
        for (o, &q) in y.iter_mut().zip(&v) {
            *o = q as f32 * d;
        }
    }
}

/// `Σ_blocks isum·(d·d8)` in block order (both ggml kernels' association), the products exact in i32.
fn dot_with<B>(w: &[B], a: &[BlockQ8K], f: impl Fn(&B) -> (u16, [i8; QK_K])) -> f32 {
    assert_eq!(
        w.len(),
        a.len(),
        "weight and activation block counts differ"
    );
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (d, v) = f(x);
        let isum: i32 = v
            .iter()
            .zip(&y.qs)
            .map(|(&q, &a)| q as i32 * a as i32)
            .sum();
        sum += isum as f32 * (f32_from_f16(d) * y.d);
    }
    sum
}

impl BlockFormat for BlockTQ1_0 {
    const TYPE: GgmlType = GgmlType::TQ1_0;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        check_len(Self::TYPE, x.len(), out.len());
        for (o, x) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
            let (d, id) = scale(x);
            let mut qs = [0u8; QS];
            let mut base = 0;
            for (start, width) in [(0usize, 32usize), (32, 16)] {
                for (m, q) in qs[start..start + width].iter_mut().enumerate() {
                    *q = pack_trits((0..5).map(|n| trit(x[base + m + n * width], id)));
                }
                base += 5 * width;
            }
            let mut qh = [0u8; QH];
            for (j, h) in qh.iter_mut().enumerate() {
                // Four trits, then a zero trit so the first lands in the most significant place.
                let t = (0..4).map(|m| trit(x[base + j + m * QH], id)).chain([0]);
                *h = pack_trits(t);
            }
            *o = BlockTQ1_0 {
                qs,
                qh,
                d: f16_from_f32(d),
            };
        }
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        check_len(Self::TYPE, out.len(), blocks.len());
        dequantize_with(blocks, out, |b| (b.d, tq1_values(b)))
    }

    /// `ggml_vec_dot_tq1_0_q8_K_generic`.
    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        dot_with(w, a, |b| (b.d, tq1_values(b)))
    }
}

impl BlockFormat for BlockTQ2_0 {
    const TYPE: GgmlType = GgmlType::TQ2_0;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        check_len(Self::TYPE, x.len(), out.len());
        for (o, x) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
            let (d, id) = scale(x);
            let mut qs = [0u8; QK_K / 4];
            for (j, q) in qs.iter_mut().enumerate() {
                let base = 128 * (j / 32) + j % 32;
                for n in 0..4 {
                    *q |= (trit(x[base + 32 * n], id) & 3) << (2 * n);
                }
            }
            *o = BlockTQ2_0 {
                qs,
                d: f16_from_f32(d),
            };
        }
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        check_len(Self::TYPE, out.len(), blocks.len());
        dequantize_with(blocks, out, |b| (b.d, tq2_values(b)))
    }

    /// `ggml_vec_dot_tq2_0_q8_K_generic`.
    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        dot_with(w, a, |b| (b.d, tq2_values(b)))
    }
}
