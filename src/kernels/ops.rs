//! Element-wise and per-vector ops shared by the model blocks, all in f32 with f64 sums where ggml has them.

/// `x ← x / sqrt(mean(x²) + eps) ⊙ w` (the sum in f64, as ggml's `rms_norm`).
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for (v, w) in x.iter_mut().zip(w) {
        *v = *v * scale * w;
    }
}

/// `x ← x / max(‖x‖₂, eps)` (llama.cpp's `l2_norm`; transformers puts eps inside the sqrt, which only
/// differs for near-zero vectors).
pub fn l2_norm(x: &mut [f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / ss.sqrt().max(eps as f64)) as f32;
    for v in x.iter_mut() {
        *v *= scale;
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `ln(1 + eˣ)`, the identity above 20 (ggml and PyTorch both switch there).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_widened(a, b, |y| y)
}

/// `Σ a_i · widen(b_i)` with 8 independent accumulators (the association of an 8-lane SIMD dot
/// product), for `b` stored in a narrower type (the F16 KV cache).
#[inline(always)]
pub fn dot_widened<T: Copy>(a: &[f32], b: &[T], widen: impl Fn(T) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, &y)| x * widen(y))
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * widen(y[l]);
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `y ← y + a·x`
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// In-place softmax: max-subtracted, the normalizer summed in f64 (as ggml).
pub fn softmax(x: &mut [f32]) {
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
