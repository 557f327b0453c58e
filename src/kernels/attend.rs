//! One query's attention over a cache with a streaming (online) softmax: scores are made a block of
//! positions at a time and the running output is rescaled when the maximum grows, so no buffer the size
//! of the context is needed. Dot products and updates use AVX2+FMA when the kernel table allows.

/// Positions per block of scores.
const BLOCK: usize = 128;

/// `out = Σ_τ softmax_τ(scale · q·k_τ) v_τ` over `τ < n_ctx`, where `k_τ = k[τ·stride..][..hd]` and the
/// same for `v` (`hd = q.len() = out.len()`). The normalizer is summed in f64.
pub fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    stride: usize,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    let hd = q.len();
    assert_eq!(out.len(), hd);
    assert!(n_ctx > 0, "attention over an empty context");
    let need = (n_ctx - 1) * stride + hd;
    assert!(
        k.len() >= need && v.len() >= need,
        "attend: cache too short"
    );
    #[cfg(target_arch = "x86_64")]
    if super::kernels().isa >= super::Isa::Avx2 && hd.is_multiple_of(8) {
        // SAFETY: the AVX2 and AVX-512 tables are only handed out after AVX2 and FMA were detected;
        // `hd` is a multiple of 8 and the rows are inside `k`/`v` (asserted above).
        unsafe { attend_avx2(q, k, v, stride, n_ctx, scale, out) };
        return;
    }
    body(
        q,
        k,
        v,
        stride,
        n_ctx,
        scale,
        out,
        super::ops::dot,
        super::ops::axpy,
    );
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn body(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    stride: usize,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
    dot: impl Fn(&[f32], &[f32]) -> f32,
    axpy: impl Fn(&mut [f32], f32, &[f32]),
) {
    let hd = q.len();
    out.fill(0.0);
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f64);
    let mut s = [0f32; BLOCK];
    for b0 in (0..n_ctx).step_by(BLOCK) {
        let s = &mut s[..BLOCK.min(n_ctx - b0)];
        let mut block_max = f32::NEG_INFINITY;
        for (i, s) in s.iter_mut().enumerate() {
            *s = dot(q, &k[(b0 + i) * stride..][..hd]) * scale;
            block_max = block_max.max(*s);
        }
        if block_max > max {
            // Everything so far was weighted by e^{−max}; move it to the new maximum.
            let c = (max - block_max).exp();
            out.iter_mut().for_each(|o| *o *= c);
            sum *= c as f64;
            max = block_max;
        }
        for (i, s) in s.iter().enumerate() {
            let p = (s - max).exp();
            sum += p as f64;
            axpy(out, p, &v[(b0 + i) * stride..][..hd]);
        }
    }
    let inv = (1.0 / sum) as f32;
    out.iter_mut().for_each(|o| *o *= inv);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    stride: usize,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    use core::arch::x86_64::*;
    let dot = |a: &[f32], b: &[f32]| {
        let mut acc = [_mm256_setzero_ps(); 2];
        for (i, (a, b)) in a.chunks_exact(8).zip(b.chunks_exact(8)).enumerate() {
            // SAFETY: the chunks are 8 floats; AVX2 and FMA are enabled for this function.
            let (x, y) = unsafe { (_mm256_loadu_ps(a.as_ptr()), _mm256_loadu_ps(b.as_ptr())) };
            acc[i % 2] = _mm256_fmadd_ps(x, y, acc[i % 2]);
        }
        let s = _mm256_add_ps(acc[0], acc[1]);
        let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    };
    let axpy = |y: &mut [f32], a: f32, x: &[f32]| {
        let a = _mm256_set1_ps(a);
        for (y, x) in y.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
            // SAFETY: the chunks are 8 floats; AVX2 and FMA are enabled for this function.
            unsafe {
                let r =
                    _mm256_fmadd_ps(a, _mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr()));
                _mm256_storeu_ps(y.as_mut_ptr(), r);
            }
        }
    };
    body(q, k, v, stride, n_ctx, scale, out, dot, axpy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ops::{dot, softmax};

    #[test]
    fn streaming_softmax_matches_two_pass() {
        let (hd, stride) = (64, 96);
        let mut seed = 99u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for n_ctx in [1usize, 5, 128, 129, 300] {
            let q: Vec<f32> = (0..hd).map(|_| 4.0 * rnd()).collect();
            let k: Vec<f32> = (0..n_ctx * stride).map(|_| rnd()).collect();
            let v: Vec<f32> = (0..n_ctx * stride).map(|_| rnd()).collect();
            let mut s: Vec<f32> = (0..n_ctx)
                .map(|t| dot(&q, &k[t * stride..][..hd]) * 0.125)
                .collect();
            softmax(&mut s);
            let mut want = vec![0f32; hd];
            for (t, p) in s.iter().enumerate() {
                for (o, v) in want.iter_mut().zip(&v[t * stride..][..hd]) {
                    *o += p * v;
                }
            }
            let mut got = vec![0f32; hd];
            attend(&q, &k, &v, stride, n_ctx, 0.125, &mut got);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "n_ctx={n_ctx}: {g} vs {w}");
            }
        }
    }
}
