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

/// `x ← H x` for every `n` values of `x` (`n` a power of two), with `H` the orthonormal Walsh–Hadamard
/// matrix `H[i][j] = (−1)^popcount(i & j) / √n` (Sylvester's construction, as llama.cpp builds its
/// rotation matrices). `H` is symmetric and `H·H = I`: applying it twice gives back `x` up to rounding.
/// A fast transform (n·log₂n additions) instead of llama.cpp's matrix product: the same values up to
/// the order of the additions.
pub fn hadamard(x: &mut [f32], n: usize) {
    assert!(
        n.is_power_of_two() && x.len().is_multiple_of(n),
        "hadamard: {n} does not tile {}",
        x.len()
    );
    // llama.cpp's entries: `1.0 / sqrtf(n)` rounded to f32.
    let scale = (1.0 / f64::from((n as f32).sqrt())) as f32;
    for x in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for pair in x.chunks_exact_mut(2 * h) {
                let (a, b) = pair.split_at_mut(h);
                for (a, b) in a.iter_mut().zip(b) {
                    (*a, *b) = (*a + *b, *a - *b);
                }
            }
            h *= 2;
        }
        x.iter_mut().for_each(|v| *v *= scale);
    }
}

/// `x ← σ(x)` element-wise.
pub fn sigmoid_in_place(x: &mut [f32]) {
    (super::kernels().ops.sigmoid)(x)
}

/// `x ← silu(x)` element-wise.
pub fn silu_in_place(x: &mut [f32]) {
    (super::kernels().ops.silu)(x)
}

/// Causal depthwise conv + SiLU over the rows of `y` (`[T × C]`): `y[t] = silu(Σ_j taps[j] ⊙ x[t + j])`,
/// `taps` `[kk × C]`, `x` `[(T + kk − 1) × C]` (see [`super::OpsFns::conv_silu`]).
pub fn conv_silu(taps: &[f32], kk: usize, x: &[f32], y: &mut [f32]) {
    (super::kernels().ops.conv_silu)(taps, kk, x, y)
}

/// [`conv_silu`] for one row `yt` (`[C]`), channels `from..C`, `xt` the window from that row: the
/// reference, and the SIMD versions' tail.
pub(crate) fn conv_silu_cols(taps: &[f32], kk: usize, xt: &[f32], yt: &mut [f32], from: usize) {
    let c = yt.len();
    for (i, y) in yt.iter_mut().enumerate().skip(from) {
        let mut s = 0.0f32;
        for j in 0..kk {
            s += taps[j * c + i] * xt[j * c + i];
        }
        *y = silu(s);
    }
}

/// Checks [`conv_silu`]'s lengths; returns `C`.
pub(crate) fn check_conv(taps: &[f32], kk: usize, x: &[f32], y: &[f32]) -> usize {
    assert!(kk > 0 && taps.len().is_multiple_of(kk), "conv_silu: taps");
    let c = taps.len() / kk;
    assert!(c > 0 && y.len().is_multiple_of(c), "conv_silu: rows");
    assert!(
        x.len() >= y.len() + (kk - 1) * c,
        "conv_silu: input window too short"
    );
    c
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
/// `row ← decay·row`, `δ = β (v_j − row·k)`, `row ← row + δ k`, `out_j = row·q`. With `from`, the
/// state before the step is read from there and the state after it written to `m` (whose contents are
/// not read): a speculative verification keeps every position's state that way without copying it.
#[allow(clippy::too_many_arguments)]
pub fn delta_step(
    from: Option<&[f32]>,
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    out: &mut [f32],
) {
    (super::kernels().ops.delta_step)(from, m, q, k, v, decay, beta, out)
}

/// Panics unless the lengths fit one head of [`delta_step`] (`m` = `v.len()` rows of `k.len()`, `from`
/// as `m`, `q` as `k`, `out` as `v`); returns `dk`.
pub(crate) fn check_delta_step(
    from: Option<&[f32]>,
    m: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
) -> usize {
    let dk = k.len();
    assert!(
        q.len() == dk
            && m.len() == v.len() * dk
            && out.len() == v.len()
            && from.is_none_or(|f| f.len() == m.len()),
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

/// LayerNorm `x ← (x − mean) / sqrt(var + eps) ⊙ w + b` (biased variance, as PyTorch), mean and variance
/// summed in f64 over eight independent lanes (which compilers vectorize).
pub fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    assert!(
        w.len() == x.len() && b.len() == x.len(),
        "layer_norm lengths"
    );
    let n = x.len() as f64;
    let mean = lane_sum(x, |v| v as f64) / n;
    let var = lane_sum(x, |v| {
        let c = v as f64 - mean;
        c * c
    }) / n;
    let inv = (1.0 / (var + eps as f64).sqrt()) as f32;
    let mean = mean as f32;
    for ((x, w), b) in x.iter_mut().zip(w).zip(b) {
        *x = (*x - mean) * inv * w + b;
    }
}

/// `Σ f(x_i)` in f64 over eight lanes folded pairwise.
#[inline(always)]
fn lane_sum(x: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for c in chunks {
        for l in 0..8 {
            acc[l] += f(c[l]);
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `x ← x + b` row by row: `x` is rows of `b.len()` elements.
pub fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (x, b) in row.iter_mut().zip(b) {
            *x += b;
        }
    }
}

/// The tanh-approximated GELU (PyTorch's `gelu(approximate="tanh")`, `gelu_pytorch_tanh`) element-wise:
/// `½x(1 + tanh u)` with `u = √(2/π)(x + 0.044715x³)`, computed as the equal `x·σ(2u)` through the
/// vector sigmoid (no cancellation for negative `x` either).
pub fn gelu_tanh_in_place(x: &mut [f32]) {
    const C: f32 = 2.0 * 0.797_884_6; // 2·√(2/π)
    let mut g = [0f32; 64];
    for x in x.chunks_mut(64) {
        let g = &mut g[..x.len()];
        for (g, &x) in g.iter_mut().zip(x.iter()) {
            *g = C * (x + 0.044715 * x * x * x);
        }
        sigmoid_mul(x, g);
    }
}

/// The exact GELU (PyTorch's `nn.GELU()`) element-wise: `½x(1 + erf(x/√2))`, in f64.
pub fn gelu_erf_in_place(x: &mut [f32]) {
    for x in x.iter_mut() {
        let v = *x as f64;
        *x = (0.5 * v * (1.0 + erf(v * std::f64::consts::FRAC_1_SQRT_2))) as f32;
    }
}

/// The error function to about 1e-15: its Maclaurin series below |x| = 2 (cancellation costs it
/// digits above), the continued fraction of erfc (60 terms) from 2 to 6, ±1 beyond
/// (erfc(6) = 2e-17). Rust's std has no `erf`.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 2.0 {
        // erf x = 2/√π Σ (−1)ⁿ x^(2n+1) / (n! (2n+1))
        let (x2, mut term, mut sum) = (a * a, a, a);
        for n in 1..100 {
            term *= -x2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a < 6.0 {
        // erfc x = e^(−x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), evaluated from the tail.
        let mut t = a;
        for k in (1..=60).rev() {
            t = a + (k as f64 / 2.0) / t;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * t)
    } else if a >= 6.0 {
        1.0
    } else {
        a // NaN
    };
    r.copysign(x)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // erf to 16 digits (Python's math.erf).
        let known = [
            (0.0, 0.0),
            (1e-3, 0.001_128_378_790_969_236_5),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.9, 0.999_958_902_121_900_1),
            (3.0, 0.999_977_909_503_001_4),
            (3.5, 0.999_999_256_901_627_7),
            (5.0, 0.999_999_999_998_462_5),
            (7.0, 1.0),
        ];
        for (x, want) in known {
            for (x, want) in [(x, want), (-x, -want)] {
                let got = erf(x);
                assert!((got - want).abs() < 2e-15, "erf({x}) = {got}, want {want}");
            }
        }
        assert!(erf(f64::NAN).is_nan());
        assert_eq!(erf(f64::INFINITY), 1.0);
    }

    #[test]
    fn gelus_match_their_definitions() {
        let xs: Vec<f32> = (-400..=400).map(|i| i as f32 * 0.025).collect();
        let mut t = xs.clone();
        gelu_tanh_in_place(&mut t);
        let mut e = xs.clone();
        gelu_erf_in_place(&mut e);
        for ((&x, &t), &e) in xs.iter().zip(&t).zip(&e) {
            let v = x as f64;
            let u = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
            let want_t = 0.5 * v * (1.0 + u.tanh());
            assert!(
                (t as f64 - want_t).abs() < 2e-6 * (1.0 + v.abs()),
                "tanh gelu({x}): {t} vs {want_t}"
            );
            // x·Φ(x), Φ(1) = 0.841344746068543; the tanh form is within 1e-3 of it.
            if x == 1.0 {
                assert!((e as f64 - 0.841_344_746_068_543).abs() < 1e-7);
            }
            assert!(e as f64 >= -0.17 && (e as f64 - want_t).abs() < 1e-3 * (1.0 + v.abs()));
        }
    }

    #[test]
    fn layer_norm_normalizes_then_scales() {
        let mut x: Vec<f32> = (0..37).map(|i| (i * i % 11) as f32 - 3.0).collect();
        let orig = x.clone();
        let w: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 * 0.01).collect();
        let b: Vec<f32> = (0..37).map(|i| i as f32 * -0.02).collect();
        layer_norm(&mut x, &w, &b, 1e-6);
        let n = orig.len() as f64;
        let mean = orig.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = orig.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        for i in 0..orig.len() {
            let want = (orig[i] as f64 - mean) / (var + 1e-6).sqrt() * w[i] as f64 + b[i] as f64;
            assert!((x[i] as f64 - want).abs() < 1e-5, "{i}: {} vs {want}", x[i]);
        }
    }
}
