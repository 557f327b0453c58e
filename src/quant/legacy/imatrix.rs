//! The legacy formats' importance-matrix quantizers (`quantize_row_q4_0_impl` etc. in ggml): per row,
//! `sigma2 = Σx²/n` over the whole row and weights `qw_i · sqrt(sigma2 + x_i²)`; Q4_0/Q5_0 search a
//! symmetric scale with `make_qx_quants`, Q4_1/Q5_1 a scale and min with `make_qkx3_quants`. Q8_0 ignores
//! the weights. Without weights every format is its reference quantizer.

use super::*;
use crate::quant::kquants::search::{
    make_qkx3_quants, make_qx_quants_weighted, sigma_weights, sum_squares,
};
use crate::quant::ImatrixQuantize;

/// Runs `f(block, its weights)` over one row with the row's sigma2.
fn weighted_row<B>(x: &[f32], qw: &[f32], out: &mut [B], f: impl Fn(&[f32], &[f32; QK]) -> B) {
    assert_eq!(
        x.len(),
        out.len() * QK,
        "input is not a whole number of blocks"
    );
    assert_eq!(qw.len(), x.len(), "one importance weight per column");
    let sigma2 = sum_squares(x) / x.len() as f32;
    for ((o, xb), wb) in out
        .iter_mut()
        .zip(x.chunks_exact(QK))
        .zip(qw.chunks_exact(QK))
    {
        *o = f(xb, &sigma_weights(sigma2, xb, wb));
    }
}

/// Codes of a symmetric block (`nmax` 8 for Q4_0, 16 for Q5_0) in `0..2·nmax` and the scale.
fn symmetric(nmax: i32, x: &[f32], w: &[f32; QK]) -> (u16, [u8; QK]) {
    let mut l = [0u8; QK];
    let d = make_qx_quants_weighted(nmax, x, w, &mut l);
    (f16_from_f32(d), l)
}

/// Codes of an affine block (`nmax` 15 for Q4_1, 31 for Q5_1), the scale and the (stored) min.
fn affine(nmax: i32, x: &[f32], w: &[f32; QK]) -> (u16, u16, [u8; QK]) {
    let mut l = [0u8; QK];
    let (d, the_min) = make_qkx3_quants(nmax, x, w, &mut l);
    (f16_from_f32(d), f16_from_f32(-the_min), l)
}

impl ImatrixQuantize for BlockQ4_0 {
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        let Some(qw) = qw else {
            return Self::quantize(x, out);
        };
        weighted_row(x, qw, out, |xb, w| {
            let (d, l) = symmetric(8, xb, w);
            BlockQ4_0 {
                d,
                qs: pack_nibbles(&l),
            }
        })
    }
}

impl ImatrixQuantize for BlockQ5_0 {
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        let Some(qw) = qw else {
            return Self::quantize(x, out);
        };
        weighted_row(x, qw, out, |xb, w| {
            let (d, l) = symmetric(16, xb, w);
            let (qh, qs) = pack_q5(&l);
            BlockQ5_0 { d, qh, qs }
        })
    }
}

impl ImatrixQuantize for BlockQ4_1 {
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        let Some(qw) = qw else {
            return Self::quantize(x, out);
        };
        weighted_row(x, qw, out, |xb, w| {
            let (d, m, l) = affine(15, xb, w);
            BlockQ4_1 {
                d,
                m,
                qs: pack_nibbles(&l),
            }
        })
    }
}

impl ImatrixQuantize for BlockQ5_1 {
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        let Some(qw) = qw else {
            return Self::quantize(x, out);
        };
        weighted_row(x, qw, out, |xb, w| {
            let (d, m, l) = affine(31, xb, w);
            let (qh, qs) = pack_q5(&l);
            BlockQ5_1 { d, m, qh, qs }
        })
    }
}

/// ggml's `quantize_q8_0` ignores the importance matrix.
impl ImatrixQuantize for BlockQ8_0 {
    fn quantize_row_imatrix(x: &[f32], _qw: Option<&[f32]>, out: &mut [Self]) {
        Self::quantize(x, out)
    }
}
