//! The element-wise ops with NEON, 4 lanes (shared by both NEON tables: baseline ARMv8 only).
//!
//! Numerics follow the scalar references in `kernels::scalar`: the same products in the same order
//! (no FMA where the reference rounds twice), sums of squares and softmax normalizers in f64 lanes
//! (only their association differs), and a vector `exp` ([`exp_q`], ≤ 2 ulp from `f32::exp`) where the
//! reference calls `f32::exp`. Tails shorter than 4 run the scalar reference's formula.

use core::arch::aarch64::*;

use crate::kernels::dispatch::OpsFns;
use crate::kernels::ops::cephes_exp::{LN2_HI, LN2_LO, LOG2E, MAX, MIN, POLY};
use crate::kernels::ops::{check_conv, conv_silu_cols, l2_scale, rms_scale, sigmoid, silu};

/// The table entry (NEON is part of every aarch64 CPU, so the wrappers need no feature check).
pub(super) static OPS: OpsFns = OpsFns {
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
    // The reference, which the compiler vectorises with NEON (baseline on aarch64); not measured on a
    // Cortex-A76 against a hand-written one.
    delta_step: crate::kernels::scalar::delta_step_ref,
    conv_silu,
};

/// `eˣ` per lane (Cephes `expf`), as the x86 `exp_ps`: `x = n ln2 + r`, a degree-7 polynomial for `eʳ`,
/// `2ⁿ` applied in two factors (subnormal results rounded once); inputs clamped to [-104, 89], NaN
/// passed through.
///
/// # Safety
/// NEON only (every aarch64 CPU).
#[inline(always)]
pub(super) unsafe fn exp_q(x: float32x4_t) -> float32x4_t {
    let xc = vminq_f32(vmaxq_f32(x, vdupq_n_f32(MIN)), vdupq_n_f32(MAX));
    let n = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(LOG2E)));
    let r = vfmsq_f32(xc, n, vdupq_n_f32(LN2_HI));
    let r = vfmsq_f32(r, n, vdupq_n_f32(LN2_LO));
    let mut p = vdupq_n_f32(POLY[0]);
    for &c in &POLY[1..] {
        p = vfmaq_f32(vdupq_n_f32(c), p, r);
    }
    let r2 = vmulq_f32(r, r);
    let p = vaddq_f32(vfmaq_f32(r, p, r2), vdupq_n_f32(1.0));
    // 2ⁿ = 2^n1 · 2^n2 with n1 = ⌊n/2⌋, n2 = n − n1: both in [-75, 64], normal floats.
    let ni = vcvtq_s32_f32(n);
    let n1 = vshrq_n_s32::<1>(ni);
    let n2 = vsubq_s32(ni, n1);
    let bias = vdupq_n_s32(127);
    let s1 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n1, bias)));
    let s2 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n2, bias)));
    let y = vmulq_f32(vmulq_f32(p, s1), s2);
    vbslq_f32(vceqq_f32(x, x), y, x)
}

/// `σ(x) = 1 / (1 + e⁻ˣ)` per lane (an exact division, as the reference).
#[inline(always)]
unsafe fn sigmoid_q(x: float32x4_t) -> float32x4_t {
    let one = vdupq_n_f32(1.0);
    vdivq_f32(one, vaddq_f32(one, exp_q(vnegq_f32(x))))
}

/// `x · σ(x)` per lane.
#[inline(always)]
unsafe fn silu_q(x: float32x4_t) -> float32x4_t {
    vmulq_f32(x, sigmoid_q(x))
}

#[inline(always)]
unsafe fn ld(p: &[f32], i: usize) -> float32x4_t {
    debug_assert!(i + 4 <= p.len());
    vld1q_f32(p.as_ptr().add(i))
}

#[inline(always)]
unsafe fn st(p: &mut [f32], i: usize, v: float32x4_t) {
    debug_assert!(i + 4 <= p.len());
    vst1q_f32(p.as_mut_ptr().add(i), v)
}

/// `acc + (lanes of v widened to f64)²` into two f64x2 accumulators.
#[inline(always)]
unsafe fn sq_f64(acc: &mut [float64x2_t; 2], v: float32x4_t) {
    let lo = vcvt_f64_f32(vget_low_f32(v));
    let hi = vcvt_high_f64_f32(v);
    acc[0] = vfmaq_f64(acc[0], lo, lo);
    acc[1] = vfmaq_f64(acc[1], hi, hi);
}

/// `Σ x²` in f64 (products of f32 values are exact in f64), four f64x2 accumulators.
fn sum_sq(x: &[f32]) -> f64 {
    // SAFETY: baseline NEON; loads stay within `x`.
    unsafe {
        let z = vdupq_n_f64(0.0);
        let (mut a, mut b) = ([z; 2], [z; 2]);
        let mut i = 0;
        while i + 8 <= x.len() {
            sq_f64(&mut a, ld(x, i));
            sq_f64(&mut b, ld(x, i + 4));
            i += 8;
        }
        if i + 4 <= x.len() {
            sq_f64(&mut a, ld(x, i));
            i += 4;
        }
        let s = vaddq_f64(vaddq_f64(a[0], a[1]), vaddq_f64(b[0], b[1]));
        let tail: f64 = x[i..].iter().map(|&v| (v as f64) * (v as f64)).sum();
        vaddvq_f64(s) + tail
    }
}

/// `x ← x · s` (`w`: `None`) or `x ← x · s · w`.
fn scale(x: &mut [f32], s: f32, w: Option<&[f32]>) {
    let n = x.len();
    let mut i = 0;
    // SAFETY: baseline NEON; loads and stores stay within `x` and `w` (length checked).
    unsafe {
        let sv = vdupq_n_f32(s);
        match w {
            Some(w) => {
                assert!(w.len() >= n, "rms_norm weight shorter than x");
                while i + 4 <= n {
                    st(x, i, vmulq_f32(vmulq_f32(ld(x, i), sv), ld(w, i)));
                    i += 4;
                }
                for (v, w) in x[i..].iter_mut().zip(&w[i..]) {
                    *v = *v * s * w;
                }
            }
            None => {
                while i + 4 <= n {
                    st(x, i, vmulq_f32(ld(x, i), sv));
                    i += 4;
                }
                x[i..].iter_mut().for_each(|v| *v *= s);
            }
        }
    }
}

fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let ss = sum_sq(x);
    let s = rms_scale(ss, x.len(), eps);
    scale(x, s, Some(w))
}

fn l2_norm(x: &mut [f32], eps: f32) {
    let ss = sum_sq(x);
    let s = l2_scale(ss, eps);
    scale(x, s, None)
}

fn softmax(x: &mut [f32]) {
    let n = x.len();
    let mut i = 0;
    // SAFETY: baseline NEON; loads and stores stay within `x`.
    let (max, mut sum) = unsafe {
        // Max: `vmaxnmq` ignores a NaN operand, as `f32::max` does.
        let mut mv = vdupq_n_f32(f32::NEG_INFINITY);
        while i + 4 <= n {
            mv = vmaxnmq_f32(mv, ld(x, i));
            i += 4;
        }
        let max = x[i..].iter().copied().fold(vmaxnmvq_f32(mv), f32::max);
        let m = vdupq_n_f32(max);
        let mut acc = [vdupq_n_f64(0.0); 2];
        i = 0;
        while i + 4 <= n {
            let e = exp_q(vsubq_f32(ld(x, i), m));
            st(x, i, e);
            acc[0] = vaddq_f64(acc[0], vcvt_f64_f32(vget_low_f32(e)));
            acc[1] = vaddq_f64(acc[1], vcvt_high_f64_f32(e));
            i += 4;
        }
        (max, vaddvq_f64(vaddq_f64(acc[0], acc[1])))
    };
    for v in x[i..].iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    scale(x, (1.0 / sum) as f32, None);
}

/// `x[i] ← f(x[i], y[i])` over 4 lanes, the scalar formula on the tail.
macro_rules! binary {
    ($name:ident, |$x:ident, $y:ident| $vec:expr, |$xs:ident, $ys:ident| $sc:expr) => {
        fn $name(x: &mut [f32], y: &[f32]) {
            let n = x.len().min(y.len());
            let mut i = 0;
            // SAFETY: baseline NEON; loads and stores stay below `min(x.len(), y.len())`.
            unsafe {
                while i + 4 <= n {
                    let ($x, $y) = (ld(x, i), ld(y, i));
                    st(x, i, $vec);
                    i += 4;
                }
            }
            for ($xs, $ys) in x[i..n].iter_mut().zip(&y[i..n]) {
                *$xs = $sc;
            }
        }
    };
}

/// `x[i] ← f(x[i])` over 4 lanes, the scalar formula on the tail.
macro_rules! unary {
    ($name:ident, |$x:ident| $vec:expr, |$xs:ident| $sc:expr) => {
        fn $name(x: &mut [f32]) {
            let mut i = 0;
            // SAFETY: baseline NEON; loads and stores stay within `x`.
            unsafe {
                while i + 4 <= x.len() {
                    let $x = ld(x, i);
                    st(x, i, $vec);
                    i += 4;
                }
            }
            for $xs in x[i..].iter_mut() {
                *$xs = $sc;
            }
        }
    };
}

unary!(exp, |v| exp_q(v), |v| v.exp());
unary!(sigmoid_all, |v| sigmoid_q(v), |v| sigmoid(*v));
unary!(silu_all, |v| silu_q(v), |v| silu(*v));
binary!(swiglu, |g, u| vmulq_f32(silu_q(g), u), |g, u| silu(*g) * u);
binary!(silu_mul, |x, z| vmulq_f32(x, silu_q(z)), |x, z| *x
    * silu(*z));
binary!(sigmoid_mul, |x, g| vmulq_f32(x, sigmoid_q(g)), |x, g| *x
    * sigmoid(*g));

fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    assert!(sin.len() == half && x.len() >= 2 * half, "rope lengths");
    let (lo, hi) = x.split_at_mut(half);
    let mut i = 0;
    // Separate multiplies and adds (no FMA): the reference's roundings exactly.
    // SAFETY: baseline NEON; loads and stores stay below `half` in each of the four slices.
    unsafe {
        while i + 4 <= half {
            let (a, b, c, s) = (ld(lo, i), ld(hi, i), ld(cos, i), ld(sin, i));
            st(lo, i, vsubq_f32(vmulq_f32(a, c), vmulq_f32(b, s)));
            st(hi, i, vaddq_f32(vmulq_f32(a, s), vmulq_f32(b, c)));
            i += 4;
        }
    }
    for i in i..half {
        let (a, b) = (lo[i], hi[i]);
        lo[i] = a * cos[i] - b * sin[i];
        hi[i] = a * sin[i] + b * cos[i];
    }
}

fn conv_silu(taps: &[f32], kk: usize, x: &[f32], y: &mut [f32]) {
    let c = check_conv(taps, kk, x, y);
    for (t, yt) in y.chunks_exact_mut(c).enumerate() {
        let xt = &x[t * c..];
        let mut i = 0;
        // SAFETY: baseline NEON; with the lengths checked, row `t`'s loads at `(t + j)·C + i + 4 ≤
        // (T + kk − 1)·C` stay in `x`, those at `j·C + i + 4 ≤ kk·C` in `taps`, the stores in `y`.
        unsafe {
            while i + 4 <= c {
                // 0 + w·x, tap by tap, multiplies and adds separate: the reference's roundings.
                let mut acc = vdupq_n_f32(0.0);
                for j in 0..kk {
                    acc = vaddq_f32(acc, vmulq_f32(ld(taps, j * c + i), ld(xt, j * c + i)));
                }
                st(yt, i, silu_q(acc));
                i += 4;
            }
        }
        conv_silu_cols(taps, kk, xt, yt, i);
    }
}
