//! The legacy 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the activation format Q8_1.
//!
//! Quantizers reproduce ggml's `quantize_row_*_ref` bit for bit: f32 arithmetic in ggml's order, the scale's
//! reciprocal taken from the unrounded f32 `d`, truncating float→int conversions for the 4/5-bit codes and `roundf`
//! (ties away from zero) for the 8-bit ones. Dot products follow ggml's generic (scalar) kernels: an exact i32 sum
//! per block, then one f32 accumulation per block in the kernel's own association.
use super::*;
use std::array::from_fn;

mod imatrix;

const QK: usize = 32;
const HALF: usize = QK / 2;

/// `d·(q − 8)`, q ∈ [0, 15]. 18 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; HALF],
}

/// `d·q + m`, q ∈ [0, 15]. 20 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; HALF],
}

/// `d·(q − 16)`, q ∈ [0, 31]; `qh` holds the fifth bits (a u32, little-endian). 22 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; HALF],
}

/// `d·q + m`, q ∈ [0, 31]. 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; HALF],
}

/// `d·q`, q ∈ [−127, 127] from the quantizer. 34 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK],
}

/// Activation format for Q4_1/Q5_1: `d·q` plus `s = d·Σq`, which carries those formats' min term. 36 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_1 {
    pub d: u16,
    pub s: u16,
    pub qs: [i8; QK],
}

// ---------------------------------------------------------------------------------------------------------------
// Shared helpers.

/// C's float → 8-bit integer conversion as ggml's x86-64 build runs it: truncate to i32 (`cvttss2si`, which gives
/// i32::MIN for NaN and out-of-range values) and keep the low byte. Rust's saturating `as i8` agrees on every
/// value in i8's range; only blocks of tiny values (whose reciprocal scale overflows) produce others.
fn c_to_byte(f: f32) -> u8 {
    let in_range = (-2_147_483_648.0..2_147_483_648.0).contains(&f);
    (if in_range { f as i32 } else { i32::MIN }) as u8
}

/// `1/d`, or 0 for a zero scale (either sign), as ggml's `d ? 1.0f/d : 0.0f`.
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Codes of a symmetric block (Q4_0: `levels` 16, Q5_0: 32). The signed value of largest magnitude (first one on
/// ties) maps to code 0, so `d = max / −(levels/2)`; its opposite would need code `levels` and is clamped.
fn quantize_symmetric(x: &[f32], levels: i8) -> (f32, [u8; QK]) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let half = (levels / 2) as f32;
    let d = max / -half;
    let id = inverse(d);
    // C: MIN(levels-1, (int8_t)(x*id + half+0.5)) stored in a uint8_t.
    let q = from_fn(|e| (c_to_byte(x[e] * id + (half + 0.5)) as i8).min(levels - 1) as u8);
    (d, q)
}

/// Codes of an affine block (Q4_1: `levels` 16, Q5_1: 32): `d = (max − min)/(levels − 1)`, codes rounded half up.
/// `clamp` is the C `MIN` applied to the int8 code (Q4_1: 15; Q5_1 has none: `i8::MAX`).
fn quantize_affine(x: &[f32], levels: i8, clamp: i8) -> (f32, f32, [u8; QK]) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / (levels - 1) as f32;
    let id = inverse(d);
    let q = from_fn(|e| (c_to_byte((x[e] - min) * id + 0.5) as i8).min(clamp) as u8);
    (d, min, q)
}

/// Codes of a Q8_0/Q8_1 block: `d = amax/127`, `q = roundf(x·id)` (ties away from zero).
fn quantize_q8(x: &[f32]) -> (f32, [i8; QK]) {
    let mut amax = 0.0f32;
    for &v in x {
        // C's MAX(amax, fabsf(v)) = `amax > |v| ? amax : |v|`, spelled out so NaN behaves as in ggml.
        amax = if amax > v.abs() { amax } else { v.abs() };
    }
    let d = amax / 127.0;
    let id = inverse(d);
    (d, from_fn(|e| c_to_byte((x[e] * id).round()) as i8))
}

/// Low nibbles hold elements 0..16, high nibbles elements 16..32 (not interleaved pairs).
fn pack_nibbles(q: &[u8; QK]) -> [u8; HALF] {
    from_fn(|j| q[j] | (q[j + HALF] << 4))
}

fn unpack_nibbles(qs: &[u8; HALF]) -> [u8; QK] {
    from_fn(|e| {
        if e < HALF {
            qs[e] & 0x0F
        } else {
            qs[e - HALF] >> 4
        }
    })
}

/// Splits 5-bit codes into the nibble array and `qh` (bit `e` = bit 4 of code `e`).
fn pack_q5(q: &[u8; QK]) -> ([u8; 4], [u8; HALF]) {
    let qh = (0..QK).fold(0u32, |h, e| h | ((((q[e] & 0x10) >> 4) as u32) << e));
    (qh.to_le_bytes(), pack_nibbles(&q.map(|v| v & 0x0F)))
}

fn unpack_q5(qh: [u8; 4], qs: &[u8; HALF]) -> [u8; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut q = unpack_nibbles(qs);
    for (e, v) in q.iter_mut().enumerate() {
        *v |= (((qh >> e) & 1) as u8) << 4;
    }
    q
}

/// Σ (q − offset)·qy over one block, exact in i32.
fn isum(q: &[u8; QK], offset: i32, qy: &[i8; QK]) -> i32 {
    q.iter()
        .zip(qy)
        .map(|(&a, &b)| (a as i32 - offset) * b as i32)
        .sum()
}

fn isum_i8(qx: &[i8; QK], qy: &[i8; QK]) -> i32 {
    qx.iter().zip(qy).map(|(&a, &b)| a as i32 * b as i32).sum()
}

/// Runs `f` over the row's 32-element chunks and their blocks.
fn for_blocks<B>(x: &[f32], out: &mut [B], f: impl Fn(&[f32]) -> B) {
    assert_eq!(
        x.len(),
        out.len() * QK,
        "input is not a whole number of blocks"
    );
    for (o, chunk) in out.iter_mut().zip(x.chunks_exact(QK)) {
        *o = f(chunk);
    }
}

/// Writes `f(block)` (32 values per block) into `out`.
fn for_outputs<B>(blocks: &[B], out: &mut [f32], f: impl Fn(&B) -> [f32; QK]) {
    assert_eq!(
        out.len(),
        blocks.len() * QK,
        "output does not match the block count"
    );
    for (o, b) in out.chunks_exact_mut(QK).zip(blocks) {
        o.copy_from_slice(&f(b));
    }
}

/// Accumulates one f32 term per block pair, in block order, as ggml's scalar kernels do.
fn sum_blocks<W, A>(w: &[W], a: &[A], term: impl Fn(&W, &A) -> f32) -> f32 {
    assert_eq!(
        w.len(),
        a.len(),
        "weight and activation block counts differ"
    );
    w.iter().zip(a).fold(0.0f32, |sum, (x, y)| sum + term(x, y))
}

// ---------------------------------------------------------------------------------------------------------------
// Formats.

impl BlockFormat for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const BLOCK: usize = QK;
    type VecDot = BlockQ8_0;

    fn quantize(x: &[f32], out: &mut [Self]) {
        for_blocks(x, out, |x| {
            let (d, q) = quantize_symmetric(x, 16);
            BlockQ4_0 {
                d: f16_from_f32(d),
                qs: pack_nibbles(&q),
            }
        })
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        for_outputs(blocks, out, |b| {
            let d = f32_from_f16(b.d);
            unpack_nibbles(&b.qs).map(|q| (q as i32 - 8) as f32 * d)
        })
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        // ggml: sumi*dx*dy, i.e. (isum·dx)·dy — unlike the other kernels, which form dx·dy first.
        sum_blocks(w, a, |x, y| {
            isum(&unpack_nibbles(&x.qs), 8, &y.qs) as f32 * f32_from_f16(x.d) * f32_from_f16(y.d)
        })
    }
}

impl BlockFormat for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const BLOCK: usize = QK;
    type VecDot = BlockQ8_1;

    fn quantize(x: &[f32], out: &mut [Self]) {
        for_blocks(x, out, |x| {
            let (d, m, q) = quantize_affine(x, 16, 15);
            BlockQ4_1 {
                d: f16_from_f32(d),
                m: f16_from_f32(m),
                qs: pack_nibbles(&q),
            }
        })
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        for_outputs(blocks, out, |b| {
            let (d, m) = (f32_from_f16(b.d), f32_from_f16(b.m));
            unpack_nibbles(&b.qs).map(|q| q as f32 * d + m)
        })
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8_1]) -> f32 {
        sum_blocks(w, a, |x, y| {
            affine_term(x.d, x.m, isum(&unpack_nibbles(&x.qs), 0, &y.qs), y)
        })
    }
}

/// One block's share of an affine (Q4_1/Q5_1) × Q8_1 dot: Σ(d·q + m)·dy·qy = (dx·dy)·isum + m·s, where the
/// activation's `s = dy·Σqy` supplies the min term without a second integer sum.
fn affine_term(d: u16, m: u16, isum: i32, y: &BlockQ8_1) -> f32 {
    (f32_from_f16(d) * f32_from_f16(y.d)) * isum as f32 + f32_from_f16(m) * f32_from_f16(y.s)
}

impl BlockFormat for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const BLOCK: usize = QK;
    type VecDot = BlockQ8_0;

    fn quantize(x: &[f32], out: &mut [Self]) {
        for_blocks(x, out, |x| {
            let (d, q) = quantize_symmetric(x, 32);
            let (qh, qs) = pack_q5(&q);
            BlockQ5_0 {
                d: f16_from_f32(d),
                qh,
                qs,
            }
        })
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        for_outputs(blocks, out, |b| {
            let d = f32_from_f16(b.d);
            unpack_q5(b.qh, &b.qs).map(|q| (q as i32 - 16) as f32 * d)
        })
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        sum_blocks(w, a, |x, y| {
            (f32_from_f16(x.d) * f32_from_f16(y.d))
                * isum(&unpack_q5(x.qh, &x.qs), 16, &y.qs) as f32
        })
    }
}

impl BlockFormat for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const BLOCK: usize = QK;
    type VecDot = BlockQ8_1;

    fn quantize(x: &[f32], out: &mut [Self]) {
        for_blocks(x, out, |x| {
            let (d, m, q) = quantize_affine(x, 32, i8::MAX);
            let (qh, qs) = pack_q5(&q);
            BlockQ5_1 {
                d: f16_from_f32(d),
                m: f16_from_f32(m),
                qh,
                qs,
            }
        })
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        for_outputs(blocks, out, |b| {
            let (d, m) = (f32_from_f16(b.d), f32_from_f16(b.m));
            unpack_q5(b.qh, &b.qs).map(|q| q as f32 * d + m)
        })
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8_1]) -> f32 {
        sum_blocks(w, a, |x, y| {
            affine_term(x.d, x.m, isum(&unpack_q5(x.qh, &x.qs), 0, &y.qs), y)
        })
    }
}

impl BlockFormat for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BLOCK: usize = QK;
    type VecDot = BlockQ8_0;

    fn quantize(x: &[f32], out: &mut [Self]) {
        for_blocks(x, out, |x| {
            let (d, qs) = quantize_q8(x);
            BlockQ8_0 {
                d: f16_from_f32(d),
                qs,
            }
        })
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        for_outputs(blocks, out, |b| {
            let d = f32_from_f16(b.d);
            b.qs.map(|q| q as f32 * d)
        })
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        sum_blocks(w, a, |x, y| {
            isum_i8(&x.qs, &y.qs) as f32 * (f32_from_f16(x.d) * f32_from_f16(y.d))
        })
    }
}

impl BlockFormat for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    const BLOCK: usize = QK;
    /// ggml never dots Q8_1 as a weight; pairing it with itself keeps the trait total.
    type VecDot = BlockQ8_1;

    fn quantize(x: &[f32], out: &mut [Self]) {
        for_blocks(x, out, |x| {
            let (d, qs) = quantize_q8(x);
            // `s` uses the unrounded f32 d, like `id`.
            let sum: i32 = qs.iter().map(|&q| q as i32).sum();
            BlockQ8_1 {
                d: f16_from_f32(d),
                s: f16_from_f32(sum as f32 * d),
                qs,
            }
        })
    }

    /// ggml has no Q8_1 dequantizer; the value model is `d·q` (`s` is redundant).
    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        for_outputs(blocks, out, |b| {
            let d = f32_from_f16(b.d);
            b.qs.map(|q| q as f32 * d)
        })
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8_1]) -> f32 {
        sum_blocks(w, a, |x, y| {
            isum_i8(&x.qs, &y.qs) as f32 * (f32_from_f16(x.d) * f32_from_f16(y.d))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantize<B: BlockFormat>(x: &[f32]) -> Vec<B> {
        let mut out = vec![B::zeroed(); x.len() / B::BLOCK];
        B::quantize(x, &mut out);
        out
    }

    fn quantized_bytes<B: BlockFormat>(x: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(&quantize::<B>(x)).to_vec()
    }

    fn dequantize<B: BlockFormat>(b: &[B]) -> Vec<f32> {
        let mut out = vec![0.0; b.len() * B::BLOCK];
        B::dequantize(b, &mut out);
        out
    }

    /// ggml's test-quantize-fns data.
    fn cos_data(offset: f32) -> Vec<f32> {
        (0..4096)
            .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
            .collect()
    }

    /// A block of 32 values: `head` followed by `fill`.
    fn block(head: &[f32], fill: f32) -> Vec<f32> {
        let mut x = vec![fill; QK];
        x[..head.len()].copy_from_slice(head);
        x
    }

    fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    /// A scale d = 1 + 2^-12: exact in f32, stored as f16 1.0, so it tells the unrounded d from the stored one.
    const D_UNROUNDED: f32 = 1.0 + 1.0 / 4096.0;

    const Q5_RAMP_QS: [u8; 16] = [
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE,
        0xFF,
    ];
    /// round(e·127/31) for e = 0..32 (no ties: the fractions are k/31).
    const Q8_RAMP_QS: [i8; 32] = [
        0, 4, 8, 12, 16, 20, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 66, 70, 74, 78, 82, 86, 90,
        94, 98, 102, 107, 111, 115, 119, 123, 127,
    ];

    #[test]
    fn round_trip_error_below_ggml_threshold() {
        fn err<B: BlockFormat>(x: &[f32]) -> f64 {
            let y = dequantize(&quantize::<B>(x));
            let sum: f64 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                .sum();
            sum.sqrt() / x.len() as f64
        }
        for offset in [0.0, 1.0] {
            let x = cos_data(offset);
            for (ty, e) in [
                (GgmlType::Q4_0, err::<BlockQ4_0>(&x)),
                (GgmlType::Q4_1, err::<BlockQ4_1>(&x)),
                (GgmlType::Q5_0, err::<BlockQ5_0>(&x)),
                (GgmlType::Q5_1, err::<BlockQ5_1>(&x)),
                (GgmlType::Q8_0, err::<BlockQ8_0>(&x)),
                (GgmlType::Q8_1, err::<BlockQ8_1>(&x)),
            ] {
                assert!(e < 0.002, "{ty} offset {offset}: {e}");
                assert!(e > 0.0, "{ty}: a lossy format cannot be exact on this data");
            }
        }
    }

    #[test]
    fn all_zero_blocks() {
        let z = [0.0f32; QK];
        // max stays +0.0, so d = 0/−8 = −0.0 and every code is trunc(8.5) = 8.
        assert_eq!(
            quantized_bytes::<BlockQ4_0>(&z),
            cat(&[&[0x00, 0x80], &[0x88; 16]])
        );
        assert_eq!(quantized_bytes::<BlockQ4_1>(&z), vec![0; 20]);
        // Every code is 16: low nibbles 0, all fifth bits set.
        assert_eq!(
            quantized_bytes::<BlockQ5_0>(&z),
            cat(&[&[0x00, 0x80], &[0xFF; 4], &[0; 16]])
        );
        assert_eq!(quantized_bytes::<BlockQ5_1>(&z), vec![0; 24]);
        assert_eq!(quantized_bytes::<BlockQ8_0>(&z), vec![0; 34]);
        assert_eq!(quantized_bytes::<BlockQ8_1>(&z), vec![0; 36]);
        // −0.0 scales still dequantize to zeros.
        assert!(dequantize(&quantize::<BlockQ4_0>(&z))
            .iter()
            .all(|&v| v == 0.0));
        assert!(dequantize(&quantize::<BlockQ5_0>(&z))
            .iter()
            .all(|&v| v == 0.0));
    }

    #[test]
    fn constant_block_affine() {
        let x = [1.5f32; QK];
        // d = 0, m = 1.5 (0x3E00), all codes 0.
        assert_eq!(
            quantized_bytes::<BlockQ4_1>(&x),
            cat(&[&[0x00, 0x00, 0x00, 0x3E], &[0; 16]])
        );
        assert_eq!(
            quantized_bytes::<BlockQ5_1>(&x),
            cat(&[&[0x00, 0x00, 0x00, 0x3E], &[0; 20]])
        );
        assert_eq!(dequantize(&quantize::<BlockQ4_1>(&x)), x.to_vec());
    }

    #[test]
    fn q4_0_hand_ramp() {
        // x = e − 16: max = −16 (first), d = 2, id = 0.5, code = trunc((e − 16)/2 + 8.5) = ceil(e/2), clamped to 15.
        // Odd e is a tie that truncation of +8.5 rounds up (ties-to-even would not).
        let x: Vec<f32> = (0..32).map(|e| e as f32 - 16.0).collect();
        let qs = [
            0x80, 0x91, 0x91, 0xA2, 0xA2, 0xB3, 0xB3, 0xC4, 0xC4, 0xD5, 0xD5, 0xE6, 0xE6, 0xF7,
            0xF7, 0xF8,
        ];
        assert_eq!(quantized_bytes::<BlockQ4_0>(&x), cat(&[&[0x00, 0x40], &qs]));
        let y = dequantize(&quantize::<BlockQ4_0>(&x));
        assert_eq!(y[0], -16.0);
        assert_eq!(y[1], -14.0);
        assert_eq!(y[2], -14.0);
        assert_eq!(y[30], 14.0);
        assert_eq!(y[31], 14.0); // 15 would need code 16
    }

    #[test]
    fn q4_0_sign_of_first_largest() {
        // The first value of largest magnitude sets the sign of d; it gets code 0, its opposite is clamped to 15.
        let rest = cat(&[&[0x80, 0x8F], &[0x88; 14]]);
        let b = quantized_bytes::<BlockQ4_0>(&block(&[4.0, -4.0], 0.0));
        assert_eq!(b, cat(&[&[0x00, 0xB8], &rest])); // d = −0.5
        let b = quantized_bytes::<BlockQ4_0>(&block(&[-4.0, 4.0], 0.0));
        assert_eq!(b, cat(&[&[0x00, 0x38], &rest])); // d = +0.5
        let y = dequantize(&quantize::<BlockQ4_0>(&block(&[4.0, -4.0], 0.0)));
        assert_eq!(&y[..3], &[4.0, -3.5, 0.0]);
    }

    #[test]
    fn q4_0_id_from_unrounded_d() {
        // d = 8.001953125/8 = 1 + 2^-12 stores as f16 1.0, but id = 1/(1 + 2^-12): 6.5·id + 8.5 = 14.998 → 14
        // (with the rounded d it would be 15).
        let b = quantized_bytes::<BlockQ4_0>(&block(&[-8.0 * D_UNROUNDED, 6.5], 0.0));
        assert_eq!(b, cat(&[&[0x00, 0x3C, 0x80, 0x8E], &[0x88; 14]]));
    }

    #[test]
    fn q4_1_hand() {
        // min = −1, max = 14: d = 1 (0x3C00), m = −1 (0xBC00); code = trunc(x + 1 + 0.5) = round half up.
        // x_e = −1 + (e − 2)/2 for e ≥ 2 gives codes (e − 1)/2; element 2 is 0 + 0.5 → 0, element 3 is 0.5 + 0.5 → 1.
        let mut x = vec![-1.0f32, 14.0];
        x.extend((2..32).map(|e| -1.0 + (e - 2) as f32 * 0.5));
        let qs = [
            0x70, 0x8F, 0x80, 0x91, 0x91, 0xA2, 0xA2, 0xB3, 0xB3, 0xC4, 0xC4, 0xD5, 0xD5, 0xE6,
            0xE6, 0xF7,
        ];
        assert_eq!(
            quantized_bytes::<BlockQ4_1>(&x),
            cat(&[&[0x00, 0x3C, 0x00, 0xBC], &qs])
        );
        let y = dequantize(&quantize::<BlockQ4_1>(&x));
        assert_eq!(&y[..4], &[-1.0, 14.0, -1.0, 0.0]);
        assert_eq!(y[31], 14.0);
    }

    #[test]
    fn q5_0_hand() {
        // x = e − 16: d = −16/−16 = 1, code = trunc(e + 0.5) = e; codes ≥ 16 set qh bits 16..32.
        let x: Vec<f32> = (0..32).map(|e| e as f32 - 16.0).collect();
        let expect = cat(&[&[0x00, 0x3C], &[0x00, 0x00, 0xFF, 0xFF], &Q5_RAMP_QS]);
        assert_eq!(quantized_bytes::<BlockQ5_0>(&x), expect);
        assert_eq!(dequantize(&quantize::<BlockQ5_0>(&x)), x);
        // max = 1 (first): d = −1/16 (0xAC00), id = −16; 1 → code 0, −1 → 32.5 → clamped 31, 0 → 16.
        let b = quantized_bytes::<BlockQ5_0>(&block(&[1.0, -1.0], 0.0));
        assert_eq!(
            b,
            cat(&[
                &[0x00, 0xAC],
                &[0xFE, 0xFF, 0xFF, 0xFF],
                &[0x00, 0x0F],
                &[0; 14]
            ])
        );
    }

    #[test]
    fn q5_1_hand() {
        // x = 2 + e/4: d = 7.75/31 = 0.25 (0x3400), m = 2 (0x4000), id = 4, code = e.
        let x: Vec<f32> = (0..32).map(|e| 2.0 + e as f32 * 0.25).collect();
        let expect = cat(&[
            &[0x00, 0x34, 0x00, 0x40],
            &[0x00, 0x00, 0xFF, 0xFF],
            &Q5_RAMP_QS,
        ]);
        assert_eq!(quantized_bytes::<BlockQ5_1>(&x), expect);
        assert_eq!(dequantize(&quantize::<BlockQ5_1>(&x)), x);
    }

    #[test]
    fn q8_0_hand() {
        // x = e: d = 31/127 → f16 0x33D0 (2000/8192), codes round(e·127/31).
        let x: Vec<f32> = (0..32).map(|e| e as f32).collect();
        let b = quantize::<BlockQ8_0>(&x);
        assert_eq!(b[0].d, 0x33D0);
        assert_eq!(b[0].qs, Q8_RAMP_QS);
        assert_eq!(dequantize(&b)[31], 127.0 * 2000.0 / 8192.0);
        // roundf: halves go away from zero (ties-to-even would give 2, −2, 2, −2).
        let b = quantize::<BlockQ8_0>(&block(&[127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5], 0.0));
        assert_eq!(b[0].d, 0x3C00);
        assert_eq!(&b[0].qs[..8], &[127, 1, -1, 2, -2, 3, -3, 0]);
        // id comes from the unrounded d = 1 + 2^-12: 63.5·id = 63.48 → 63 (rounded d would give 64).
        let b = quantize::<BlockQ8_0>(&block(&[127.0 * D_UNROUNDED, 63.5], 0.0));
        assert_eq!(b[0].d, 0x3C00);
        assert_eq!(&b[0].qs[..3], &[127, 63, 0]);
        // Layout: d at offset 0, qs from offset 2.
        assert_eq!(&bytemuck::bytes_of(&b[0])[..4], &[0x00, 0x3C, 127, 63]);
    }

    #[test]
    fn q8_1_hand() {
        let x: Vec<f32> = (0..32).map(|e| e as f32).collect();
        let b = quantize::<BlockQ8_1>(&x);
        // Σq = 2032, s = 2032·(31/127) = 496 (0x5FC0).
        assert_eq!((b[0].d, b[0].s, b[0].qs), (0x33D0, 0x5FC0, Q8_RAMP_QS));
        assert_eq!(
            &bytemuck::bytes_of(&b[0])[..6],
            &[0xD0, 0x33, 0xC0, 0x5F, 0, 4]
        );
        // s uses the unrounded d = 1 + 2^-12: Σq = 2049 → 2049.5 → 2050 (0x6801); the rounded d = 1 would give the
        // tie 2049 → 2048 (0x6800).
        let b = quantize::<BlockQ8_1>(&block(
            &[
                127.0 * D_UNROUNDED,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                127.0,
                17.0,
            ],
            0.0,
        ));
        assert_eq!((b[0].d, b[0].s), (0x3C00, 0x6801));
        assert_eq!(b[0].qs.iter().map(|&q| q as i32).sum::<i32>(), 2049);
        assert_eq!(dequantize(&b)[16], 17.0);
    }

    #[test]
    fn tiny_blocks_follow_x86_conversion() {
        // Scales so small that 1/d overflows to +-Inf: x·id is +-Inf (or NaN for zeros), which x86 converts to the
        // integer 0x80000000 whose low byte is 0. The whole block comes out zero, as in ggml's x86-64 build.
        assert_eq!(
            quantized_bytes::<BlockQ8_0>(&block(&[1e-38], 0.0)),
            vec![0; 34]
        );
        assert_eq!(
            quantized_bytes::<BlockQ4_0>(&block(&[-1e-38], 0.0)),
            vec![0; 18]
        );
        assert_eq!(c_to_byte(f32::NAN), 0);
        assert_eq!(c_to_byte(f32::NEG_INFINITY), 0);
        assert_eq!(c_to_byte(16.99), 16);
        assert_eq!(c_to_byte(-3.7), (-3i8) as u8);
    }

    /// Weight `W` against activations in its partner format, both quantized from ggml's test data.
    fn check_dot<W: BlockFormat>(min_term: impl Fn(&W, &W::VecDot) -> f64) {
        let (x, y) = (cos_data(0.0), cos_data(1.0));
        let (w, a) = (quantize::<W>(&x), quantize::<W::VecDot>(&y));
        let (xd, yd) = (dequantize(&w), dequantize(&a));
        let got = W::vec_dot_ref(&w, &a) as f64;

        // Same quantized data in f64: only the f32 roundings of the per-block terms and the running sum differ
        // (at most (blocks + 4)·ε relative to Σ|w·a|), plus, for Q8_1 partners, the f16 `s` standing in for dy·Σqy.
        let same: f64 = xd.iter().zip(&yd).map(|(p, q)| *p as f64 * *q as f64).sum();
        let abs: f64 = xd
            .iter()
            .zip(&yd)
            .map(|(p, q)| (*p as f64 * *q as f64).abs())
            .sum();
        let s_err: f64 = w.iter().zip(&a).map(|(p, q)| min_term(p, q)).sum::<f64>() * 2f64.powi(-9);
        let tol = (w.len() + 4) as f64 * f32::EPSILON as f64 * abs + s_err;
        assert!(
            (got - same).abs() <= tol,
            "{}: {got} vs {same} (tol {tol})",
            W::TYPE
        );

        let exact: f64 = x.iter().zip(&y).map(|(p, q)| *p as f64 * *q as f64).sum();
        assert!(
            (got - exact).abs() / (x.len() as f64) < 0.02,
            "{}: {got} vs {exact}",
            W::TYPE
        );
    }

    #[test]
    fn dot_matches_f64_references() {
        check_dot::<BlockQ4_0>(|_, _| 0.0);
        check_dot::<BlockQ5_0>(|_, _| 0.0);
        check_dot::<BlockQ8_0>(|_, _| 0.0);
        check_dot::<BlockQ8_1>(|_, _| 0.0);
        fn m_s(m: u16, y: &BlockQ8_1) -> f64 {
            (f32_from_f16(m) as f64 * f32_from_f16(y.s) as f64).abs()
        }
        check_dot::<BlockQ4_1>(|x, y| m_s(x.m, y));
        check_dot::<BlockQ5_1>(|x, y| m_s(x.m, y));
    }

    #[test]
    fn q4_0_dot_association() {
        // isum = 7·(31·127 + 126) = 28441, dx = dy = 1 + 2^-10: ggml's (isum·dx)·dy rounds differently from
        // isum·(dx·dy) (which would give bits 0x46DEA127).
        let w = BlockQ4_0 {
            d: 0x3C01,
            qs: [0xFF; 16],
        };
        let mut qs = [127i8; 32];
        qs[31] = 126;
        let a = BlockQ8_0 { d: 0x3C01, qs };
        assert_eq!(BlockQ4_0::vec_dot_ref(&[w], &[a]).to_bits(), 0x46DE_A126);
    }

    #[test]
    fn q4_1_dot_uses_s_and_adds_block_terms_whole() {
        let mut qs = [0u8; 16];
        qs[0] = 1; // element 0 has code 1, all others 0
        let mut q8 = [0i8; 32];
        // Block 1 contributes (1·1)·1 + 0·0 = 1.
        q8[0] = 1;
        let (w1, a1) = (
            BlockQ4_1 {
                d: 0x3C00,
                m: 0,
                qs,
            },
            BlockQ8_1 {
                d: 0x3C00,
                s: 0,
                qs: q8,
            },
        );
        // Block 2: (1024·1024)·32 + (−4096)·8192 = 2^25 − 2^25 = 0, summed before joining the running sum (added
        // term by term, 1 + 2^25 would lose the 1). s = 8192 is deliberately not dy·Σqy = 32768: the kernel must
        // take the min term from s.
        q8[0] = 32;
        let (w2, a2) = (
            BlockQ4_1 {
                d: 0x6400,
                m: 0xEC00,
                qs,
            },
            BlockQ8_1 {
                d: 0x6400,
                s: 0x7000,
                qs: q8,
            },
        );
        assert_eq!(BlockQ4_1::vec_dot_ref(&[w1, w2], &[a1, a2]), 1.0);
    }

    #[test]
    fn small_dots_by_hand() {
        let ramp: Vec<f32> = (0..32).map(|e| e as f32).collect();
        let ones = BlockQ8_0 {
            d: 0x3800,
            qs: [1; 32],
        }; // 0.5 each
           // Q5_0 codes e (d = 1): Σ(e − 16)·0.5 = (496 − 512)/2.
        let w = quantize::<BlockQ5_0>(&ramp.iter().map(|v| v - 16.0).collect::<Vec<_>>());
        assert_eq!(BlockQ5_0::vec_dot_ref(&w, &[ones]), -8.0);
        // Q8_0 ramp (d = 2000/8192) · 0.5: Σq = 2032.
        let w = quantize::<BlockQ8_0>(&ramp);
        assert_eq!(
            BlockQ8_0::vec_dot_ref(&w, &[ones]),
            2032.0 * 1000.0 / 8192.0
        );
        // Q5_1 (d = 1/4, m = 2, codes e) · ones (d = 1, s = 32): 0.25·496 + 2·32.
        let w = quantize::<BlockQ5_1>(&ramp.iter().map(|v| 2.0 + v * 0.25).collect::<Vec<_>>());
        let ones1 = BlockQ8_1 {
            d: 0x3C00,
            s: 0x5000,
            qs: [1; 32],
        };
        assert_eq!(BlockQ5_1::vec_dot_ref(&w, &[ones1]), 188.0);
        // Q8_1 · Q8_1: ramp codes · 1 with d = 2000/8192 and 1.
        let w = quantize::<BlockQ8_1>(&ramp);
        assert_eq!(
            BlockQ8_1::vec_dot_ref(&w, &[ones1]),
            2032.0 * 2000.0 / 8192.0
        );
    }

    #[test]
    fn row_dispatch_reads_ggml_bytes() {
        // The Q5_1 hand block as raw bytes, through the type-erased entry point.
        let bytes = cat(&[
            &[0x00, 0x34, 0x00, 0x40],
            &[0x00, 0x00, 0xFF, 0xFF],
            &Q5_RAMP_QS,
        ]);
        let mut y = [0.0f32; 32];
        dequantize_row(GgmlType::Q5_1, &bytes, &mut y).unwrap();
        assert!(y
            .iter()
            .enumerate()
            .all(|(e, &v)| v == 2.0 + e as f32 * 0.25));
        let mut out = vec![0u8; 24];
        quantize_row(GgmlType::Q5_1, &y, &mut out).unwrap();
        assert_eq!(out, bytes);
    }
}
