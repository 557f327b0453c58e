//! The scalar reference kernels: every SIMD path is tested against these.

use super::attend::{attend_many_ref, attend_ref, values_ref, weights_ref};
use super::dispatch::{AttendSteps, Isa, Kernels, OpsFns};
use super::ops::{
    axpy, check_conv, check_delta_step, conv_silu_cols, dot, l2_scale, rms_scale, sigmoid, silu,
};
use crate::quant::{self, GgmlType};

pub static KERNELS: Kernels = Kernels {
    isa: Isa::Scalar,
    quant_rows,
    quant_gemm: None,
    float_rows,
    quantize_act,
    attend_f32: attend_ref::<f32>,
    attend_f16: attend_ref::<half::f16>,
    attend_many_f32: attend_many_ref::<f32>,
    attend_many_f16: attend_many_ref::<half::f16>,
    attend_steps: AttendSteps {
        weights: weights_ref,
        values: values_ref,
    },
    ops: OPS,
};

/// The reference element-wise ops.
pub static OPS: OpsFns = OpsFns {
    rms_norm: rms_norm_ref,
    l2_norm: l2_norm_ref,
    softmax: softmax_ref,
    exp: exp_ref,
    sigmoid: sigmoid_ref,
    silu: silu_ref,
    swiglu: swiglu_ref,
    silu_mul: silu_mul_ref,
    sigmoid_mul: sigmoid_mul_ref,
    rope: rope_ref,
    delta_step: delta_step_ref,
    conv_silu: conv_silu_ref,
};

/// Quantized weight rows · quantized activation rows, block by block (`BlockFormat::vec_dot_ref`).
pub fn quant_rows(ty: GgmlType, w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
    let n_rows = out.len() / n_tok;
    let (rb, ab) = (w.len() / n_rows, a.len() / n_tok);
    for (r, o) in out.chunks_exact_mut(n_tok).enumerate() {
        for (t, o) in o.iter_mut().enumerate() {
            *o = quant::vec_dot_row(ty, &w[r * rb..(r + 1) * rb], &a[t * ab..(t + 1) * ab])
                .expect("row lengths checked at load");
        }
    }
}

/// Float weight rows · f32 activation rows.
pub fn float_rows(ty: GgmlType, w: &[u8], a: &[f32], n_tok: usize, out: &mut [f32]) {
    let n_rows = out.len() / n_tok;
    let (rb, n) = (w.len() / n_rows, a.len() / n_tok);
    let dot: fn(&[u8], &[f32]) -> f32 = match ty {
        GgmlType::F32 => dot_f32,
        GgmlType::F16 => dot_f16,
        GgmlType::BF16 => dot_bf16,
        other => panic!("float_rows called with {other}"),
    };
    for (r, o) in out.chunks_exact_mut(n_tok).enumerate() {
        for (t, o) in o.iter_mut().enumerate() {
            *o = dot(&w[r * rb..(r + 1) * rb], &a[t * n..(t + 1) * n]);
        }
    }
}

/// The reference activation quantizers (Q8_0, Q8_1, Q8_K).
pub fn quantize_act(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    quant::quantize_row(ty, x, out).expect("lengths match");
}

/// Dot product with 8 independent accumulators: vectorizes and loses less precision than one running sum.
#[inline]
fn dot_lanes(n: usize, w: impl Fn(usize) -> f32, a: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let full = n / 8 * 8;
    for i in (0..full).step_by(8) {
        for l in 0..8 {
            acc[l] += w(i + l) * a[i + l];
        }
    }
    let tail: f32 = (full..n).map(|i| w(i) * a[i]).sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

pub fn dot_f32(w: &[u8], a: &[f32]) -> f32 {
    match bytemuck::try_cast_slice::<u8, f32>(w) {
        Ok(w) => dot_lanes(a.len(), |i| w[i], a),
        Err(_) => dot_lanes(
            a.len(),
            |i| f32::from_le_bytes(w[4 * i..4 * i + 4].try_into().unwrap()),
            a,
        ),
    }
}

pub fn dot_f16(w: &[u8], a: &[f32]) -> f32 {
    dot_lanes(
        a.len(),
        |i| quant::f32_from_f16(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])),
        a,
    )
}

pub fn dot_bf16(w: &[u8], a: &[f32]) -> f32 {
    dot_lanes(
        a.len(),
        |i| quant::f32_from_bf16(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])),
        a,
    )
}

/// `x ← x / sqrt(mean(x²) + eps) ⊙ w` (the sum in f64, as ggml's `rms_norm`).
pub fn rms_norm_ref(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = rms_scale(ss, x.len(), eps);
    for (v, w) in x.iter_mut().zip(w) {
        *v = *v * scale * w;
    }
}

/// `x ← x / max(‖x‖₂, eps)` (llama.cpp's `l2_norm`; transformers puts eps inside the sqrt, which only
/// differs for near-zero vectors).
pub fn l2_norm_ref(x: &mut [f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = l2_scale(ss, eps);
    for v in x.iter_mut() {
        *v *= scale;
    }
}

/// In-place softmax: max-subtracted, the normalizer summed in f64 (as ggml).
pub fn softmax_ref(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

pub fn exp_ref(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = v.exp());
}

pub fn sigmoid_ref(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = sigmoid(*v));
}

pub fn silu_ref(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu(*v));
}

pub fn conv_silu_ref(taps: &[f32], kk: usize, x: &[f32], y: &mut [f32]) {
    let c = check_conv(taps, kk, x, y);
    for (t, yt) in y.chunks_exact_mut(c).enumerate() {
        conv_silu_cols(taps, kk, &x[t * c..], yt, 0);
    }
}

pub fn swiglu_ref(g: &mut [f32], u: &[f32]) {
    for (g, u) in g.iter_mut().zip(u) {
        *g = silu(*g) * u;
    }
}

pub fn silu_mul_ref(x: &mut [f32], z: &[f32]) {
    for (x, z) in x.iter_mut().zip(z) {
        *x *= silu(*z);
    }
}

pub fn sigmoid_mul_ref(x: &mut [f32], g: &[f32]) {
    for (x, g) in x.iter_mut().zip(g) {
        *x *= sigmoid(*g);
    }
}

pub fn rope_ref(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    assert!(sin.len() == half && x.len() >= 2 * half, "rope lengths");
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = a * sin[i] + b * cos[i];
    }
}

/// One token of the delta rule on one head ([`OpsFns::delta_step`]): `m` `[dv × dk]` (read from `from`
/// when given), `q`, `k` `[dk]`, `v`, `out` `[dv]`.
#[allow(clippy::too_many_arguments)]
pub fn delta_step_ref(
    from: Option<&[f32]>,
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    out: &mut [f32],
) {
    let dk = check_delta_step(from, m, q, k, v, out);
    for (j, ((row, &vj), o)) in m
        .chunks_exact_mut(dk)
        .zip(v)
        .zip(out.iter_mut())
        .enumerate()
    {
        if let Some(f) = from {
            // Row by row, so the copy is still in L1 for the passes below.
            row.copy_from_slice(&f[j * dk..][..dk]);
        }
        row.iter_mut().for_each(|s| *s *= decay);
        let delta = beta * (vj - dot(row, k));
        axpy(row, delta, k);
        *o = dot(row, q);
    }
}
