//! Element-wise and per-vector ops shared by the model blocks, all in f32 with f64 sums where ggml has them.
//! The slice ops run through the kernel table ([`super::kernels`]`().ops`): SIMD versions held by tests to
//! the scalar references in [`super::scalar`].

/// `x ← x / sqrt(mean(x²) + eps) ⊙ w` (the sum in f64, as ggml's `rms_norm`).
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    (super::kernels().ops.rms_norm)(x, w, eps)
}

/// `x ← x / max(‖x‖₂, eps)` (llama.cpp's `l2_norm`; transformers puts eps inside the sqrt, which only
/// differs for near-zero vectors).
pub fn l2_norm(x: &mut [f32], eps: f32) {
    (super::kernels().ops.l2_norm)(x, eps)
}

/// `x ← eˣ` element-wise.
pub fn exp_in_place(x: &mut [f32]) {
    (super::kernels().ops.exp)(x)
}

/// `x ← σ(x)` element-wise.
pub fn sigmoid_in_place(x: &mut [f32]) {
    (super::kernels().ops.sigmoid)(x)
}

/// `x ← silu(x)` element-wise.
pub fn silu_in_place(x: &mut [f32]) {
    (super::kernels().ops.silu)(x)
}

/// SwiGLU: `g ← silu(g) ⊙ u`.
pub fn swiglu(g: &mut [f32], u: &[f32]) {
    (super::kernels().ops.swiglu)(g, u)
}

/// `x ← x ⊙ silu(z)`.
pub fn silu_mul(x: &mut [f32], z: &[f32]) {
    (super::kernels().ops.silu_mul)(x, z)
}

/// `x ← x ⊙ σ(g)`.
pub fn sigmoid_mul(x: &mut [f32], g: &[f32]) {
    (super::kernels().ops.sigmoid_mul)(x, g)
}

/// One token of the delta rule on one head's state `m` (`[dv × dk]`, row `j` = value dim `j`): per row,
/// `row ← decay·row`, `δ = β (v_j − row·k)`, `row ← row + δ k`, `out_j = row·q`.
pub fn delta_step(
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    out: &mut [f32],
) {
    (super::kernels().ops.delta_step)(m, q, k, v, decay, beta, out)
}

/// Panics unless the lengths fit one head of [`delta_step`] (`m` = `v.len()` rows of `k.len()`, `q` as
/// `k`, `out` as `v`); returns `dk`.
pub(crate) fn check_delta_step(m: &[f32], q: &[f32], k: &[f32], v: &[f32], out: &[f32]) -> usize {
    let dk = k.len();
    assert!(
        q.len() == dk && m.len() == v.len() * dk && out.len() == v.len(),
        "delta_step lengths"
    );
    dk
}

/// NEOX RoPE with the angles of [`rope_cos_sin`]: pairs `(x[i], x[i + h])`, `i < h = cos.len()`, rotated;
/// the rest of `x` is left alone.
pub fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    (super::kernels().ops.rope)(x, cos, sin)
}

/// Cosines and sines of the NEOX RoPE angles `pos · base^(−2i/n_rot)`, `i < n_rot/2`, computed in f64 so
/// large positions keep their precision: once per position, for every head.
pub fn rope_cos_sin(pos: usize, n_rot: usize, base: f32) -> (Vec<f32>, Vec<f32>) {
    rope_cos_sin_by(|_| pos, n_rot, base)
}

/// [`rope_cos_sin`] with the position of rotary pair `i` given by `pos_of(i)` (M-RoPE: each pair takes
/// one axis of a multi-dimensional position). The same arithmetic, so equal positions give equal
/// values bit for bit.
pub fn rope_cos_sin_by(
    pos_of: impl Fn(usize) -> usize,
    n_rot: usize,
    base: f32,
) -> (Vec<f32>, Vec<f32>) {
    (0..n_rot / 2)
        .map(|i| {
            let theta = pos_of(i) as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
            let (sin, cos) = theta.sin_cos();
            (cos as f32, sin as f32)
        })
        .unzip()
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
    (super::kernels().ops.softmax)(x)
}

/// RMSNorm's factor `1 / sqrt(Σx²/n + eps)` from the f64 sum of squares, the same in every table.
pub(crate) fn rms_scale(sum_sq: f64, n: usize, eps: f32) -> f32 {
    (1.0 / (sum_sq / n as f64 + eps as f64).sqrt()) as f32
}

/// The L2 norm's factor `1 / max(‖x‖₂, eps)` from the f64 sum of squares, the same in every table.
pub(crate) fn l2_scale(sum_sq: f64, eps: f32) -> f32 {
    (1.0 / sum_sq.sqrt().max(eps as f64)) as f32
}

/// The constants of the vector `exp` (Cephes `expf`), shared by every instruction set's version:
/// `x = n ln2 + r` with `ln 2` split in two, `eʳ ≈ 1 + r + r²·P(r)` with `P` of degree 5 (Horner from the
/// highest coefficient), inputs clamped to `[MIN, MAX]` (below: 0; above: +inf, as `f32::exp`).
pub(crate) mod cephes_exp {
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    /// `LN2_HI` has 9 significant bits, so `n · LN2_HI` is exact for |n| < 2¹⁵.
    pub const LN2_HI: f32 = 0.693_359_4;
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    /// `P`'s coefficients, highest degree first.
    pub const POLY: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
    pub const MIN: f32 = -104.0;
    pub const MAX: f32 = 89.0;
}
