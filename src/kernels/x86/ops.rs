//! The element-wise ops with AVX2 + FMA, 8 lanes (shared by the AVX2 and AVX-512 tables).
//!
//! Numerics follow the scalar references in `kernels::scalar`: the same products in the same order
//! (no FMA where the reference rounds twice), sums of squares and softmax normalizers in f64 lanes
//! (only their association differs), and a vector `exp` ([`exp_ps`], ≤ 2 ulp from `f32::exp`) where the
//! reference calls `f32::exp`. Tails shorter than 8 run the scalar reference's formula.

use core::arch::x86_64::*;

use super::StreamPrefetch;
use crate::kernels::dispatch::OpsFns;
use crate::kernels::ops::cephes_exp::{LN2_HI, LN2_LO, LOG2E, MAX, MIN, POLY};
use crate::kernels::ops::{
    check_conv, check_delta_step, conv_silu_cols, l2_scale, rms_scale, sigmoid, silu,
};

/// The table entry: a safe wrapper per op around its `#[target_feature]` body.
pub(crate) static OPS: OpsFns = OpsFns {
    rms_norm,
    l2_norm,
    softmax,
    exp,
    sigmoid: sigmoid_all,
    silu: silu_all,
    swiglu,
    silu_mul,
    sigmoid_mul,
    rope,
    delta_step,
    conv_silu,
};

/// `eˣ` per lane (Cephes `expf`): `x = n ln2 + r`, |r| ≤ ln2/2, `eʳ` by a degree-7 polynomial, times
/// `2ⁿ` applied in two factors so that subnormal results are rounded once. Inputs are clamped to
/// [-104, 89] (below: 0; above: +inf, as `f32::exp`); NaN stays NaN.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline(always)]
pub(crate) unsafe fn exp_ps(x: __m256) -> __m256 {
    // `max_ps`/`min_ps` return their second operand when either is NaN: a NaN `x` stays NaN through
    // the clamp and everything after it (no blend needed).
    let xc = _mm256_min_ps(_mm256_set1_ps(MAX), _mm256_max_ps(_mm256_set1_ps(MIN), x));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(LOG2E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(POLY[0]);
    for &c in &POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let p = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    // 2ⁿ = 2^n1 · 2^n2 with n1 = ⌊n/2⌋, n2 = n − n1: both in [-75, 64], normal floats.
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    _mm256_mul_ps(_mm256_mul_ps(p, s1), s2)
}

/// `σ(x) = 1 / (1 + e⁻ˣ)` per lane (an exact division, as the reference).
#[inline(always)]
unsafe fn sigmoid_ps(x: __m256) -> __m256 {
    let one = _mm256_set1_ps(1.0);
    let e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_div_ps(one, _mm256_add_ps(one, e))
}

/// `x · σ(x)` per lane.
#[inline(always)]
unsafe fn silu_ps(x: __m256) -> __m256 {
    _mm256_mul_ps(x, sigmoid_ps(x))
}

#[inline(always)]
unsafe fn ld(p: &[f32], i: usize) -> __m256 {
    debug_assert!(i + 8 <= p.len());
    _mm256_loadu_ps(p.as_ptr().add(i))
}

#[inline(always)]
unsafe fn st(p: &mut [f32], i: usize, v: __m256) {
    debug_assert!(i + 8 <= p.len());
    _mm256_storeu_ps(p.as_mut_ptr().add(i), v)
}

#[inline(always)]
unsafe fn hsum_pd(v: __m256d) -> f64 {
    let s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
    _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
}

/// `acc + (lanes of v widened to f64)²` into two f64x4 accumulators.
#[inline(always)]
unsafe fn sq_f64(acc: &mut [__m256d; 2], v: __m256) {
    let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v));
    acc[0] = _mm256_fmadd_pd(lo, lo, acc[0]);
    acc[1] = _mm256_fmadd_pd(hi, hi, acc[1]);
}

/// `Σ x²` in f64 (products of f32 values are exact in f64), four f64x4 accumulators.
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_sq(x: &[f32]) -> f64 {
    let z = _mm256_setzero_pd();
    let (mut a, mut b) = ([z; 2], [z; 2]);
    let mut i = 0;
    while i + 16 <= x.len() {
        sq_f64(&mut a, ld(x, i));
        sq_f64(&mut b, ld(x, i + 8));
        i += 16;
    }
    if i + 8 <= x.len() {
        sq_f64(&mut a, ld(x, i));
        i += 8;
    }
    let s = _mm256_add_pd(_mm256_add_pd(a[0], a[1]), _mm256_add_pd(b[0], b[1]));
    let tail: f64 = x[i..].iter().map(|&v| (v as f64) * (v as f64)).sum();
    hsum_pd(s) + tail
}

/// `x ← x · s` (`w`: `None`) or `x ← x · s · w`.
#[target_feature(enable = "avx2,fma")]
unsafe fn scale(x: &mut [f32], s: f32, w: Option<&[f32]>) {
    let n = x.len();
    let sv = _mm256_set1_ps(s);
    let mut i = 0;
    match w {
        Some(w) => {
            assert!(w.len() >= n, "rms_norm weight shorter than x");
            while i + 8 <= n {
                st(x, i, _mm256_mul_ps(_mm256_mul_ps(ld(x, i), sv), ld(w, i)));
                i += 8;
            }
            for (v, w) in x[i..].iter_mut().zip(&w[i..]) {
                *v = *v * s * w;
            }
        }
        None => {
            while i + 8 <= n {
                st(x, i, _mm256_mul_ps(ld(x, i), sv));
                i += 8;
            }
            x[i..].iter_mut().for_each(|v| *v *= s);
        }
    }
}

fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    // SAFETY: the x86 tables holding `OPS` are only handed out after AVX2 and FMA were detected;
    // `sum_sq` and `scale` check their lengths.
    unsafe {
        let ss = sum_sq(x);
        let s = rms_scale(ss, x.len(), eps);
        scale(x, s, Some(w))
    }
}

fn l2_norm(x: &mut [f32], eps: f32) {
    // SAFETY: as `rms_norm`.
    unsafe {
        let ss = sum_sq(x);
        let s = l2_scale(ss, eps);
        scale(x, s, None)
    }
}

/// The largest element (−∞ for none). `max_ps(v, m)` returns `m` where `v` is NaN, so NaN is skipped as
/// by `f32::max`.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
pub(crate) unsafe fn max_of(x: &[f32]) -> f32 {
    let n8 = x.len() / 8 * 8;
    let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
    for i in (0..n8).step_by(8) {
        mv = _mm256_max_ps(ld(x, i), mv);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), mv);
    lanes
        .iter()
        .chain(&x[n8..])
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_impl(x: &mut [f32]) {
    let n = x.len();
    let max = max_of(x);
    let m = _mm256_set1_ps(max);
    let z = _mm256_setzero_pd();
    let mut acc = [z; 2];
    let mut i = 0;
    while i + 8 <= n {
        let e = exp_ps(_mm256_sub_ps(ld(x, i), m));
        st(x, i, e);
        acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(e)));
        i += 8;
    }
    let mut sum = hsum_pd(_mm256_add_pd(acc[0], acc[1]));
    for v in x[i..].iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    scale(x, (1.0 / sum) as f32, None);
}

fn softmax(x: &mut [f32]) {
    // SAFETY: as `rms_norm`.
    unsafe { softmax_impl(x) }
}

/// `x[i] ← f(x[i], y[i])` over 8 lanes, `g` (the scalar formula) on the tail.
macro_rules! binary {
    ($name:ident, $impl:ident, |$x:ident, $y:ident| $vec:expr, |$xs:ident, $ys:ident| $sc:expr) => {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $impl(x: &mut [f32], y: &[f32]) {
            let n = x.len().min(y.len());
            let mut i = 0;
            while i + 8 <= n {
                let ($x, $y) = (ld(x, i), ld(y, i));
                st(x, i, $vec);
                i += 8;
            }
            for ($xs, $ys) in x[i..n].iter_mut().zip(&y[i..n]) {
                *$xs = $sc;
            }
        }

        fn $name(x: &mut [f32], y: &[f32]) {
            // SAFETY: the x86 tables holding `OPS` are only handed out after AVX2 and FMA were
            // detected; loads and stores stay below `min(x.len(), y.len())`.
            unsafe { $impl(x, y) }
        }
    };
}

/// `x[i] ← f(x[i])` over 8 lanes, the scalar formula on the tail.
macro_rules! unary {
    ($name:ident, $impl:ident, |$x:ident| $vec:expr, |$xs:ident| $sc:expr) => {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $impl(x: &mut [f32]) {
            let mut i = 0;
            while i + 8 <= x.len() {
                let $x = ld(x, i);
                st(x, i, $vec);
                i += 8;
            }
            for $xs in x[i..].iter_mut() {
                *$xs = $sc;
            }
        }

        fn $name(x: &mut [f32]) {
            // SAFETY: the x86 tables holding `OPS` are only handed out after AVX2 and FMA were
            // detected; loads and stores stay within `x`.
            unsafe { $impl(x) }
        }
    };
}

unary!(exp, exp_impl, |v| exp_ps(v), |v| v.exp());
unary!(sigmoid_all, sigmoid_impl, |v| sigmoid_ps(v), |v| sigmoid(
    *v
));
unary!(silu_all, silu_impl, |v| silu_ps(v), |v| silu(*v));
binary!(
    swiglu,
    swiglu_impl,
    |g, u| _mm256_mul_ps(silu_ps(g), u),
    |g, u| silu(*g) * u
);
binary!(
    silu_mul,
    silu_mul_impl,
    |x, z| _mm256_mul_ps(x, silu_ps(z)),
    |x, z| *x * silu(*z)
);
binary!(
    sigmoid_mul,
    sigmoid_mul_impl,
    |x, g| _mm256_mul_ps(x, sigmoid_ps(g)),
    |x, g| *x * sigmoid(*g)
);

#[target_feature(enable = "avx2,fma")]
unsafe fn rope_impl(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    assert!(sin.len() == half && x.len() >= 2 * half, "rope lengths");
    let (lo, hi) = x.split_at_mut(half);
    let mut i = 0;
    // Separate multiplies and adds (no FMA): the reference's roundings exactly.
    while i + 8 <= half {
        let (a, b, c, s) = (ld(lo, i), ld(hi, i), ld(cos, i), ld(sin, i));
        st(
            lo,
            i,
            _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)),
        );
        st(
            hi,
            i,
            _mm256_add_ps(_mm256_mul_ps(a, s), _mm256_mul_ps(b, c)),
        );
        i += 8;
    }
    for i in i..half {
        let (a, b) = (lo[i], hi[i]);
        lo[i] = a * cos[i] - b * sin[i];
        hi[i] = a * sin[i] + b * cos[i];
    }
}

fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    // SAFETY: as `rms_norm`; lengths are checked inside.
    unsafe { rope_impl(x, cos, sin) }
}

/// The reference `dot`'s final fold of its 8 lane sums: `((l0+l4) + (l1+l5)) + ((l2+l6) + (l3+l7))`.
#[inline(always)]
unsafe fn fold8_like_dot(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let t = _mm_add_ps(s, _mm_shuffle_ps::<0b10_11_00_01>(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_movehl_ps(t, t)))
}

/// One token of the delta rule on one head, bit for bit the reference's operations: the decay and the
/// update are separate multiplies and adds, each dot product one 8-lane accumulator (the reference's 8
/// accumulators) folded as the reference folds them. Two passes per state row instead of four, and the
/// state prefetched [`StreamPrefetch`]'s distance ahead: it comes from memory once per token. The first
/// pass reads row `j` at `src` and writes it at `dst` (the same pointer for a step in place); the second
/// reads and writes `dst`.
///
/// # Safety
/// The CPU must have AVX2; `dk` must be a multiple of 8; `src` and `dst` must each hold `v.len() × dk`
/// floats (the same ones, or not overlapping), `dst` writable, and `q`, `k`, `out` as `delta_step_ref`
/// checks.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn delta_step_rows<const STREAMS: usize>(
    src: *const f32,
    dst: *mut f32,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    out: &mut [f32],
) {
    let dk = k.len();
    let dec = _mm256_set1_ps(decay);
    // Each state is one stream: each row's reads request the lines 2 KiB ahead (4 rows at `dk` = 128).
    let streams = [src as *const u8, dst as *const u8];
    let mut pf = StreamPrefetch::<STREAMS>::new(core::array::from_fn(|i| streams[i]));
    for (j, (&vj, o)) in v.iter().zip(out.iter_mut()).enumerate() {
        pf.upto((j + 1) * dk * 4);
        let (from, row) = (src.add(j * dk), dst.add(j * dk));
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < dk {
            let r = _mm256_mul_ps(_mm256_loadu_ps(from.add(i)), dec);
            _mm256_storeu_ps(row.add(i), r);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(r, ld(k, i)));
            i += 8;
        }
        // The reference adds its (empty) tail sum, 0.0, too.
        let delta = _mm256_set1_ps(beta * (vj - (fold8_like_dot(acc) + 0.0)));
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < dk {
            let r = _mm256_add_ps(_mm256_loadu_ps(row.add(i)), _mm256_mul_ps(delta, ld(k, i)));
            _mm256_storeu_ps(row.add(i), r);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(r, ld(q, i)));
            i += 8;
        }
        *o = fold8_like_dot(acc) + 0.0;
    }
}

/// [`delta_step_rows`] in place (one prefetch stream) or from `from` into `m` (two).
///
/// # Safety
/// As [`delta_step_rows`]; the lengths checked by the caller.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn delta_step_impl(
    from: Option<&[f32]>,
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    out: &mut [f32],
) {
    let dst = m.as_mut_ptr();
    match from {
        Some(f) => delta_step_rows::<2>(f.as_ptr(), dst, q, k, v, decay, beta, out),
        None => delta_step_rows::<1>(dst, dst, q, k, v, decay, beta, out),
    }
}

#[allow(clippy::too_many_arguments)]
fn delta_step(
    from: Option<&[f32]>,
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    out: &mut [f32],
) {
    if !check_delta_step(from, m, q, k, v, out).is_multiple_of(8) {
        return crate::kernels::scalar::delta_step_ref(from, m, q, k, v, decay, beta, out);
    }
    // SAFETY: as `rms_norm`; `dk` is a multiple of 8 and the lengths are checked above (`from`, when
    // given, is as long as `m`, and a shared slice cannot overlap the `&mut` one), so every 8-lane load
    // and store stays inside its slice; the prefetch addresses are never dereferenced.
    unsafe { delta_step_impl(from, m, q, k, v, decay, beta, out) }
}

/// # Safety
/// The CPU must have AVX2 and FMA; the lengths as [`check_conv`] checks them, `c = taps.len() / kk`.
#[target_feature(enable = "avx2,fma")]
unsafe fn conv_silu_impl(taps: &[f32], kk: usize, c: usize, x: &[f32], y: &mut [f32]) {
    for (t, yt) in y.chunks_exact_mut(c).enumerate() {
        let xt = &x[t * c..];
        let mut i = 0;
        while i + 8 <= c {
            // 0 + w·x, tap by tap, multiplies and adds separate: the reference's roundings.
            let mut acc = _mm256_setzero_ps();
            for j in 0..kk {
                acc = _mm256_add_ps(acc, _mm256_mul_ps(ld(taps, j * c + i), ld(xt, j * c + i)));
            }
            st(yt, i, silu_ps(acc));
            i += 8;
        }
        conv_silu_cols(taps, kk, xt, yt, i);
    }
}

fn conv_silu(taps: &[f32], kk: usize, x: &[f32], y: &mut [f32]) {
    let c = check_conv(taps, kk, x, y);
    // SAFETY: as `rms_norm`; with the lengths checked, row `t`'s loads at `(t + j)·C + i + 8 ≤
    // (T + kk − 1)·C` stay in `x`, those at `j·C + i + 8 ≤ kk·C` in `taps`, the stores in `y`.
    unsafe { conv_silu_impl(taps, kk, c, x, y) }
}
