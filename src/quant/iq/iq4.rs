//! IQ4_NL and IQ4_XS: 4-bit codes into the 16 non-linear levels `KVALUES_IQ4NL`, one f16 scale per 32
//! values (IQ4_NL) or an f16 super-scale with 6-bit sub-scales per 32 values (IQ4_XS).
//!
//! The quantizer is ggml's `quantize_row_iq4_nl_impl`, step for step in f32 (ggml's order, no FMA):
//! per 32 values a scale from the largest magnitude, refined by weighted least squares over `2·ntry + 1`
//! trial scales. ggml runs it with `ntry = -1` in `quantize_row_iq4_nl_ref` (no trials) and with
//! `ntry = 7` in `quantize_iq4_nl`/`quantize_iq4_xs`, which is what llama-quantize calls with or without an
//! importance matrix: so [`BlockFormat::quantize`] (the `_ref` quantizer) and
//! [`ImatrixQuantize::quantize_row_imatrix`] without weights differ for IQ4_NL. For IQ4_XS both are
//! `quantize_iq4_xs` with `ntry = 7`.

use super::blocks::{BlockIQ4NL, BlockIQ4XS, QK4_NL};
use super::grids::KVALUES_IQ4NL;
use crate::quant::{
    f16_from_f32, f32_from_f16, nearest_int, BlockFormat, BlockQ8K, BlockQ8_0, GgmlType,
    ImatrixQuantize, QK_K,
};

/// Sub-block length: one scale (IQ4_NL) or one 6-bit sub-scale (IQ4_XS) per 32 values.
const SUB: usize = 32;
/// A sub-block whose largest magnitude is below this is all zero (`GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;
/// Trial scales on each side of the first guess in `quantize_iq4_nl`/`quantize_iq4_xs`.
const NTRY: i32 = 7;

/// `KVALUES_IQ4NL[q]` as f32.
fn level(q: u8) -> f32 {
    KVALUES_IQ4NL[q as usize] as f32
}

/// The index of the level nearest to `x` (ggml's `best_index_int8`: a bisection, ties to the upper level
/// only when strictly nearer).
pub(crate) fn best_index(x: f32) -> u8 {
    let v = &KVALUES_IQ4NL;
    if x <= v[0] as f32 {
        return 0;
    }
    if x >= v[15] as f32 {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v[mid] as f32 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - (v[hi - 1] as f32) < (v[hi] as f32) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// Σ w·q·x and Σ w·q² for the levels nearest to `id·x`, writing the codes to `codes` when given.
fn fit(xb: &[f32], weight: &[f32], id: f32, mut codes: Option<&mut [u8]>) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (j, (&x, &w)) in xb.iter().zip(weight).enumerate() {
        let l = best_index(id * x);
        if let Some(c) = codes.as_deref_mut() {
            c[j] = l;
        }
        let q = level(l);
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// Codes of `x` for the reciprocal scale `id`.
fn codes_for(x: &[f32], id: f32, codes: &mut [u8]) {
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = best_index(id * v);
    }
}

/// The best scale of one 32-value sub-block (0 for an all-zero one), writing its codes to `codes`
/// (left as they were for an all-zero sub-block, as in ggml).
fn sub_block_scale(xb: &[f32], weight: &[f32], ntry: i32, codes: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &x in xb {
        let ax = x.abs();
        if ax > amax {
            amax = ax;
            max = x;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = KVALUES_IQ4NL[0] as f32;
    let d = if ntry > 0 { -max / v0 } else { max / v0 };
    let (sumqx, sumq2) = fit(xb, weight, 1.0 / d, Some(codes));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        let id = (itry + KVALUES_IQ4NL[0] as i32) as f32 / max;
        let (sumqx, sumq2) = fit(xb, weight, id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Per-value weights of a sub-block: the importance `qw` scaled by `√(σ² + x²)`, or `x²` without one.
fn weights(xb: &[f32], qw: Option<&[f32]>, sigma2: f32, out: &mut [f32; SUB]) {
    match qw {
        Some(qw) => {
            for ((w, &q), &x) in out.iter_mut().zip(qw).zip(xb) {
                *w = q * (sigma2 + x * x).sqrt();
            }
        }
        None => {
            for (w, &x) in out.iter_mut().zip(xb) {
                *w = x * x;
            }
        }
    }
}

/// `2/n · Σ x²`, summed in element order.
fn sigma2(x: &[f32]) -> f32 {
    let mut s = 0f32;
    for &v in x {
        s += v * v;
    }
    s * (2.0 / x.len() as f32)
}

/// Packs codes in ggml's nibble order: byte `j` of each 32 holds code `j` (low) and `j + 16` (high).
fn pack(codes: &[u8], qs: &mut [u8]) {
    for (q, c) in qs.chunks_exact_mut(16).zip(codes.chunks_exact(SUB)) {
        for (j, byte) in q.iter_mut().enumerate() {
            *byte = c[j] | (c[j + 16] << 4);
        }
    }
}

/// One IQ4_NL block (`quantize_row_iq4_nl_impl` with a 32-value super-block). `codes` carries over from
/// the previous block of the row, as ggml's buffer does (it matters only for an all-zero block with
/// `ntry ≤ 0`, whose codes ggml leaves as they were).
fn quantize_nl_block(
    x: &[f32],
    qw: Option<&[f32]>,
    ntry: i32,
    codes: &mut [u8; QK4_NL],
) -> BlockIQ4NL {
    let mut weight = [0f32; SUB];
    weights(x, qw, sigma2(x), &mut weight);
    let d = sub_block_scale(x, &weight, ntry, codes);
    if ntry > 0 {
        codes_for(x, if d != 0.0 { 1.0 / d } else { 0.0 }, codes);
    }
    let mut qs = [0u8; QK4_NL / 2];
    pack(codes, &mut qs);
    BlockIQ4NL {
        d: f16_from_f32(d),
        qs,
    }
}

/// One IQ4_XS super-block (`quantize_row_iq4_nl_impl` with 256 values and 6-bit sub-scales).
fn quantize_xs_block(x: &[f32], qw: Option<&[f32]>, ntry: i32) -> BlockIQ4XS {
    let sigma2 = sigma2(x);
    let mut codes = [0u8; QK_K];
    let mut scales = [0f32; QK_K / SUB];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for (ib, (xb, cb)) in x
        .chunks_exact(SUB)
        .zip(codes.chunks_exact_mut(SUB))
        .enumerate()
    {
        let mut weight = [0f32; SUB];
        weights(
            xb,
            qw.map(|q| &q[ib * SUB..(ib + 1) * SUB]),
            sigma2,
            &mut weight,
        );
        let d = sub_block_scale(xb, &weight, ntry, cb);
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let d = -max_scale / 32.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (mut scales_h, mut scales_l) = (0u16, [0u8; QK_K / 64]);
    for (ib, (xb, cb)) in x
        .chunks_exact(SUB)
        .zip(codes.chunks_exact_mut(SUB))
        .enumerate()
    {
        let l = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * l as f32;
        codes_for(xb, if dl != 0.0 { 1.0 / dl } else { 0.0 }, cb);
        let l = (l + 32) as u8;
        scales_l[ib / 2] |= (l & 0xf) << (4 * (ib % 2));
        scales_h |= ((l >> 4) as u16) << (2 * ib);
    }
    let mut qs = [0u8; QK_K / 2];
    pack(&codes, &mut qs);
    BlockIQ4XS {
        d: f16_from_f32(d),
        scales_h,
        scales_l,
        qs,
    }
}

fn check_len(what: GgmlType, x: usize, blocks: usize, block: usize) {
    assert_eq!(
        x,
        blocks * block,
        "{what}: input is not a whole number of blocks"
    );
}

/// The 6-bit sub-scale `ib` of an IQ4_XS block, minus its offset 32.
fn xs_scale(b: &BlockIQ4XS, ib: usize) -> i32 {
    let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
    let hi = ((b.scales_h >> (2 * ib)) & 3) as u8;
    (lo | (hi << 4)) as i32 - 32
}

/// Σ q8·level over one 32-value sub-block (16 code bytes, 32 activations), as two 16-lane halves.
fn sub_dot(qs: &[u8], q8: &[i8]) -> i32 {
    let (mut lo, mut hi) = (0i32, 0i32);
    for (j, &q) in qs[..16].iter().enumerate() {
        lo += q8[j] as i32 * KVALUES_IQ4NL[(q & 0xf) as usize] as i32;
        hi += q8[j + 16] as i32 * KVALUES_IQ4NL[(q >> 4) as usize] as i32;
    }
    lo + hi
}

impl BlockFormat for BlockIQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const BLOCK: usize = QK4_NL;
    type VecDot = BlockQ8_0;

    /// `quantize_row_iq4_nl_ref`: no trial scales (`ntry = -1`).
    fn quantize(x: &[f32], out: &mut [Self]) {
        check_len(Self::TYPE, x.len(), out.len(), QK4_NL);
        let mut codes = [0u8; QK4_NL];
        for (o, xb) in out.iter_mut().zip(x.chunks_exact(QK4_NL)) {
            *o = quantize_nl_block(xb, None, -1, &mut codes);
        }
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        check_len(Self::TYPE, out.len(), blocks.len(), QK4_NL);
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_NL)) {
            let d = f32_from_f16(b.d);
            for (j, &q) in b.qs.iter().enumerate() {
                y[j] = d * level(q & 0xf);
                y[j + 16] = d * level(q >> 4);
            }
        }
    }

    /// `ggml_vec_dot_iq4_nl_q8_0_generic`: per block (d8·d4)·isum, summed in block order.
    fn vec_dot_ref(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        assert_eq!(
            w.len(),
            a.len(),
            "weight and activation block counts differ"
        );
        let mut sum = 0f32;
        for (x, y) in w.iter().zip(a) {
            let d = f32_from_f16(y.d) * f32_from_f16(x.d);
            sum += d * sub_dot(&x.qs, &y.qs) as f32;
        }
        sum
    }
}

impl ImatrixQuantize for BlockIQ4NL {
    /// `quantize_iq4_nl` on one row: 7 trial scales on each side, weights `qw·√(σ² + x²)` or `x²`.
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        check_len(Self::TYPE, x.len(), out.len(), QK4_NL);
        if let Some(qw) = qw {
            assert_eq!(
                qw.len(),
                x.len(),
                "IQ4_NL: importance weights do not match the row"
            );
        }
        let mut codes = [0u8; QK4_NL];
        for (i, (o, xb)) in out.iter_mut().zip(x.chunks_exact(QK4_NL)).enumerate() {
            let qb = qw.map(|q| &q[i * QK4_NL..(i + 1) * QK4_NL]);
            *o = quantize_nl_block(xb, qb, NTRY, &mut codes);
        }
    }
}

impl BlockFormat for BlockIQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    /// `quantize_row_iq4_xs_ref`, which is `quantize_iq4_xs` without weights.
    fn quantize(x: &[f32], out: &mut [Self]) {
        Self::quantize_row_imatrix(x, None, out)
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        check_len(Self::TYPE, out.len(), blocks.len(), QK_K);
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f32_from_f16(b.d);
            for (ib, (qs, yb)) in
                b.qs.chunks_exact(16)
                    .zip(y.chunks_exact_mut(SUB))
                    .enumerate()
            {
                let dl = d * xs_scale(b, ib) as f32;
                for (j, &q) in qs.iter().enumerate() {
                    yb[j] = dl * level(q & 0xf);
                    yb[j + 16] = dl * level(q >> 4);
                }
            }
        }
    }

    /// `ggml_vec_dot_iq4_xs_q8_K_generic`: per sub-block (d4·d8·(ls − 32))·isum, summed in order.
    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        assert_eq!(
            w.len(),
            a.len(),
            "weight and activation block counts differ"
        );
        let mut sum = 0f32;
        for (x, y) in w.iter().zip(a) {
            let d4d8 = f32_from_f16(x.d) * y.d;
            for ib in 0..QK_K / SUB {
                let dl = d4d8 * xs_scale(x, ib) as f32;
                let isum = sub_dot(
                    &x.qs[16 * ib..16 * ib + 16],
                    &y.qs[SUB * ib..SUB * ib + SUB],
                );
                sum += dl * isum as f32;
            }
        }
        sum
    }
}

impl ImatrixQuantize for BlockIQ4XS {
    /// `quantize_iq4_xs` on one row.
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        check_len(Self::TYPE, x.len(), out.len(), QK_K);
        if let Some(qw) = qw {
            assert_eq!(
                qw.len(),
                x.len(),
                "IQ4_XS: importance weights do not match the row"
            );
        }
        for (i, (o, xb)) in out.iter_mut().zip(x.chunks_exact(QK_K)).enumerate() {
            *o = quantize_xs_block(xb, qw.map(|q| &q[i * QK_K..(i + 1) * QK_K]), NTRY);
        }
    }
}
