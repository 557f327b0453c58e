//! K-quant formats: 256-element super-blocks (spec gguf-and-quants §3.8–3.14, §4.6–4.8, §5.3).
//!
//! Q2_K..Q6_K are weight formats, Q8_K is the activation format they are all dotted with. The quantizers
//! reproduce ggml's `quantize_row_*_K_ref` byte for byte, so every float expression keeps ggml's order
//! (f32, left to right, no FMA) and sums run sequentially in element order. The scalar dot products follow
//! ggml's generic kernels: exact i32 sums per block, then f32 scaling in the same order.

mod q2k;
mod q3k;
mod q4k;
mod q5k;
mod q6k;
mod q8k;
pub(super) mod search;

pub use q2k::BlockQ2K;
pub use q3k::BlockQ3K;
pub use q4k::BlockQ4K;
pub use q5k::BlockQ5K;
pub use q6k::BlockQ6K;
pub use q8k::BlockQ8K;

use super::{f16_from_f32, f32_from_f16, nearest_int, QK_K};
use search::{
    make_qkx2_quants, make_qkx3_quants, make_qp_quants, sigma_weights, sum_in_order, sum_squares,
    MinSearch,
};

/// Runs `f` on each 256-element chunk of `x`, one output block each.
fn quantize_blocks<B>(x: &[f32], out: &mut [B], f: impl Fn(&[f32]) -> B) {
    assert_eq!(
        x.len(),
        out.len() * QK_K,
        "quantize: input is not out.len() super-blocks"
    );
    for (xb, b) in x.chunks_exact(QK_K).zip(out) {
        *b = f(xb);
    }
}

/// Runs `f` on each 256-element chunk of `x` with the same chunk of the importance weights `qw`.
fn weighted_blocks<B>(x: &[f32], qw: &[f32], out: &mut [B], f: impl Fn(&[f32], &[f32]) -> B) {
    assert_eq!(
        x.len(),
        out.len() * QK_K,
        "quantize: input is not out.len() super-blocks"
    );
    assert_eq!(
        qw.len(),
        x.len(),
        "quantize: one importance weight per column"
    );
    for ((xb, wb), b) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(out) {
        *b = f(xb, wb);
    }
}

/// Runs `f` on each block with its 256-element output chunk.
fn dequantize_blocks<B>(blocks: &[B], out: &mut [f32], f: impl Fn(&B, &mut [f32])) {
    assert_eq!(
        out.len(),
        blocks.len() * QK_K,
        "dequantize: output is not blocks.len() super-blocks"
    );
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        f(b, y);
    }
}

/// Packs 256 two-bit values as Q2_K/Q3_K do: in each 128-element half, byte `l` holds elements
/// `l, l+32, l+64, l+96` in bits 0–1, 2–3, 4–5, 6–7.
fn pack_2bit(l: &[u8; QK_K]) -> [u8; 64] {
    std::array::from_fn(|i| {
        let (h, j) = (i / 32, i % 32);
        let e = 128 * h + j;
        l[e] | (l[e + 32] << 2) | (l[e + 64] << 4) | (l[e + 96] << 6)
    })
}

/// The two-bit value of element `e` from [`pack_2bit`]'s layout.
fn unpack_2bit(qs: &[u8; 64], e: usize) -> u8 {
    let (h, r) = (e / 128, e % 128);
    (qs[32 * h + r % 32] >> (2 * (r / 32))) & 3
}

/// Packs 8 six-bit scales and 8 six-bit mins into 12 bytes (§3.8, Q4_K/Q5_K): the low 6 bits of the
/// first four of each in bytes 0–7, the rest as nibbles in bytes 8–11 with their top 2 bits in the
/// spare bits 6–7 of bytes 0–7. Inputs must be ≤ 63.
fn pack_scale_min(s: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut b = [0u8; 12];
    for k in 0..4 {
        b[k] = s[k] | ((s[k + 4] >> 4) << 6);
        b[k + 4] = m[k] | ((m[k + 4] >> 4) << 6);
        b[k + 8] = (s[k + 4] & 0xF) | ((m[k + 4] & 0xF) << 4);
    }
    b
}

/// Inverse of [`pack_scale_min`] (ggml's `get_scale_min_k4` for all 8 sub-blocks).
fn unpack_scale_min(b: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let s = std::array::from_fn(|j| match j {
        0..4 => b[j] & 63,
        _ => (b[j + 4] & 0xF) | ((b[j - 4] >> 6) << 4),
    });
    let m = std::array::from_fn(|j| match j {
        0..4 => b[j + 4] & 63,
        _ => (b[j + 4] >> 4) | ((b[j] >> 6) << 4),
    });
    (s, m)
}

/// Everything of a Q4_K/Q5_K block except the packing of its quants.
struct ScaleMinBlock {
    d: u16,
    dmin: u16,
    scales: [u8; 12],
    /// Quants in `0..=nmax`, in element order.
    l: [u8; QK_K],
}

/// The shared part of Q4_K and Q5_K quantization (§4.6 steps 1–3): an asymmetric scale/min search per
/// 32-element sub-block, the 6-bit quantization of those scales and mins against f16 super-scales, and
/// the re-quantization of the elements with the rounded scales.
fn quantize_scale_min(x: &[f32], p: &MinSearch) -> ScaleMinBlock {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0.0f32; 8], [0.0f32; 8]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for k in 0..8 {
        let xk = &x[32 * k..32 * k + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xk {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let w: [f32; 32] = std::array::from_fn(|i| av_x + xk[i].abs());
        (scales[k], mins[k]) = make_qkx2_quants(p, xk, &w, &mut l[32 * k..32 * k + 32]);
        if scales[k] > max_scale {
            max_scale = scales[k];
        }
        if mins[k] > max_min {
            max_min = mins[k];
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // ggml stores the int into a u8 before clamping, so a negative value wraps and clamps to 63.
    let ls: [u8; 8] = std::array::from_fn(|k| (nearest_int(inv_scale * scales[k]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|k| (nearest_int(inv_min * mins[k]) as u8).min(63));
    let d = f16_from_f32(max_scale / 63.0);
    let dmin = f16_from_f32(max_min / 63.0);

    // Re-quantize against the scales as they will be decoded. A sub-block whose scale rounds to zero
    // keeps its search-phase quants, as in ggml.
    for k in 0..8 {
        let dk = f32_from_f16(d) * ls[k] as f32;
        if dk == 0.0 {
            continue;
        }
        let mk = f32_from_f16(dmin) * lm[k] as f32;
        for i in 32 * k..32 * k + 32 {
            l[i] = nearest_int((x[i] + mk) / dk).clamp(0, p.nmax) as u8;
        }
    }
    ScaleMinBlock {
        d,
        dmin,
        scales: pack_scale_min(&ls, &lm),
        l,
    }
}

/// The shared part of ggml's `quantize_row_q4_K_impl` / `quantize_row_q5_K_impl` (importance weights `qw`):
/// a weighted `make_qkx3_quants` per 32-element sub-block, the 6-bit scales and mins by `make_qp_quants`
/// weighted by the sub-blocks' total weights, and the re-quantization against the decoded scales.
/// `clamp_63`: Q5_K clamps the 6-bit values before packing, Q4_K does not (they never exceed 63 in practice).
fn quantize_scale_min_weighted(x: &[f32], qw: &[f32], nmax: i32, clamp_63: bool) -> ScaleMinBlock {
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
    for j in 0..8 {
        let xj = &x[32 * j..32 * j + 32];
        let w: [f32; 32] = sigma_weights(sigma2, xj, &qw[32 * j..]);
        sw[j] = sum_in_order(&w);
        (scales[j], mins[j]) = make_qkx3_quants(nmax, xj, &w, &mut l[32 * j..32 * j + 32]);
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    if clamp_63 {
        ls = ls.map(|v| v.min(63));
        lm = lm.map(|v| v.min(63));
    }
    let scales = pack_scale_min_literal(&ls, &lm);
    let d = f16_from_f32(d_block);
    let dmin = f16_from_f32(m_block);

    let (sc, m) = unpack_scale_min(&scales);
    for j in 0..8 {
        let dj = f32_from_f16(d) * sc[j] as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = f32_from_f16(dmin) * m[j] as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    ScaleMinBlock { d, dmin, scales, l }
}

/// [`pack_scale_min`] as ggml's `_impl` quantizers write it, for any byte values: the first four scales
/// and mins whole, the top bits of the rest shifted in with u8 truncation.
fn pack_scale_min_literal(s: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut b = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            b[j] = s[j];
            b[j + 4] = m[j];
        } else {
            b[j + 4] = (s[j] & 0xF) | ((m[j] & 0xF) << 4);
            b[j - 4] |= (s[j] >> 4) << 6;
            b[j] |= (m[j] >> 4) << 6;
        }
    }
    b
}

/// ggml's generic K-quant kernels accumulate `scale · q · qy` in 8 i32 lanes (element `e` in lane
/// `e % 8`); keeping the lanes reproduces their float rounding. `scales` has one entry per sub-block.
fn lane_sums(q: &[i8; QK_K], scales: &[i32], qy: &[i8; QK_K]) -> [i32; 8] {
    let sub = QK_K / scales.len();
    let mut lanes = [0i32; 8];
    for (e, (&qx, &qa)) in q.iter().zip(qy).enumerate() {
        lanes[e % 8] += scales[e / sub] * (qx as i32 * qa as i32);
    }
    lanes
}

/// One weight block's contribution in ggml's generic kernels: `d = d_x·d_y` scales the lanes, and
/// `min` (already `dmin_x·d_y·Σ bsums·m`) is subtracted from a separate scalar.
struct BlockDot {
    d: f32,
    lanes: [i32; 8],
    min: f32,
}

/// Sums a row the way ggml's generic Q3_K..Q6_K kernels do: 8 f32 lane accumulators across blocks, the
/// min terms in a scalar, lanes added to the scalar at the end.
fn dot_lanes<W>(w: &[W], a: &[BlockQ8K], block: impl Fn(&W, &BlockQ8K) -> BlockDot) -> f32 {
    assert_eq!(
        w.len(),
        a.len(),
        "vec_dot: weight and activation rows differ in length"
    );
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let b = block(x, y);
        for (s, &lane) in sums.iter_mut().zip(&b.lanes) {
            *s += b.d * lane as f32;
        }
        sumf -= b.min;
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

#[cfg(test)]
mod tests;
