//! ggml's per-sub-block scale searches (spec §4.2–4.4), shared by the K-quant quantizers.
//!
//! Every expression keeps ggml's evaluation order (f32, left to right, no FMA) and every sum runs in
//! element order: the packed bytes depend on the last bit of these floats.

use crate::quant::nearest_int;

/// ggml's `GROUP_MAX_EPS`: below this the sub-block counts as all zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// Largest |x| and the signed value holding it; strict `>` so the first occurrence wins and NaN never does.
pub(super) fn abs_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// `make_qx_quants` with `rmse_type = 1` and no importance weights (weights `x²`), as Q6_K uses it.
/// Writes `L` in `0..2·nmax` and returns the scale (sign opposite to the largest-magnitude element).
pub(in crate::quant) fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    qx_search(nmax, x, |i| x[i] * x[i], l)
}

/// `make_qx_quants` with `rmse_type = 1` and explicit weights `w` (the importance-matrix paths).
pub(in crate::quant) fn make_qx_quants_weighted(
    nmax: i32,
    x: &[f32],
    w: &[f32],
    l: &mut [u8],
) -> f32 {
    qx_search(nmax, x, |i| w[i], l)
}

/// The body of `make_qx_quants` (rmse_type 1): 19 candidate grids, weighted least-squares scale for each.
fn qx_search(nmax: i32, x: &[f32], weight: impl Fn(usize) -> f32, l: &mut [u8]) -> f32 {
    let (amax, max) = abs_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for (i, &v) in x.iter().enumerate() {
            let q = quant(iscale, v) as f32;
            let w = weight(i);
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let mut write = |iscale: f32| {
        for (li, &v) in l.iter_mut().zip(x) {
            *li = (quant(iscale, v) + nmax) as u8;
        }
    };

    let iscale = -(nmax as f32) / max;
    write(iscale);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            write(iscale);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` with `do_rmse = true` (Q3_K): a first guess refined by up to 5 coordinate sweeps.
/// Writes `L` in `0..2·nmax` (all 0, not `nmax`, for an all-zero sub-block) and returns the scale.
pub(super) fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    let (amax, max) = abs_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut q = [0i32; 32];
    let q = &mut q[..x.len()];
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let w = v * v;
        sumlx += w * v * *qi as f32;
        suml2 += w * *qi as f32 * *qi as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (qi, &v) in q.iter_mut().zip(x) {
            let w = v * v;
            let mut slx = sumlx - w * v * *qi as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * *qi as f32 * *qi as f32;
                let new_q = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_q != *qi {
                    slx += w * v * new_q as f32;
                    sl2 += w * new_q as f32 * new_q as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *qi = new_q;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (li, &qi) in l.iter_mut().zip(q.iter()) {
        *li = (qi + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Parameters of `make_qkx2_quants` for one format.
pub(in crate::quant) struct MinSearch {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    /// Absolute instead of squared error.
    pub use_mad: bool,
}

/// `make_qkx2_quants`: fits `x ≈ scale·L − the_min` (L in `0..=nmax`, `the_min ≥ 0`) with weights `w`,
/// trying `nstep + 1` candidate grids. Returns `(scale, the_min)` and writes `L`.
///
/// ggml updates `min` in place when a trial wins, and later trials build their grid from that updated
/// value; the port keeps this state on purpose.
pub(in crate::quant) fn make_qkx2_quants(
    p: &MinSearch,
    x: &[f32],
    w: &[f32],
    l: &mut [u8],
) -> (f32, f32) {
    let nmax = p.nmax;
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &wi) in x.iter().zip(w).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += wi;
        sum_x += wi * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };
    let grid = |iscale: f32, min: f32, v: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;

    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for ((li, &v), &wi) in l.iter_mut().zip(x).zip(w) {
        *li = grid(iscale, min, v);
        best_error += wi * err(scale * *li as f32 + min - v);
    }

    let mut laux = [0u8; 32];
    let laux = &mut laux[..x.len()];
    for is in 0..=p.nstep {
        let iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((la, &v), &wi) in laux.iter_mut().zip(x).zip(w) {
            *la = grid(iscale, min, v);
            let q = *la as f32;
            sum_l += wi * q;
            sum_l2 += wi * q * q;
            sum_xl += wi * q * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for ((&la, &v), &wi) in laux.iter().zip(x).zip(w) {
                cur_error += wi * err(this_scale * la as f32 + this_min - v);
            }
            if cur_error < best_error {
                l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `make_qkx3_quants` with ggml's only parameters (`rmin −0.9`, `rdelta 0.05`, 36 steps, squared error) and
/// explicit weights: the importance-matrix search of Q2_K, Q4_K, Q5_K, Q4_1 and Q5_1. Its body is
/// `make_qkx2_quants` except for the all-equal test (`max <= min` instead of `max == min`), which cannot
/// differ: `min ≤ 0` and `max ≥ x[0] ≥ min`, and both tests are false for NaN.
pub(in crate::quant) fn make_qkx3_quants(
    nmax: i32,
    x: &[f32],
    w: &[f32],
    l: &mut [u8],
) -> (f32, f32) {
    let p = MinSearch {
        nmax,
        rmin: -0.9,
        rdelta: 0.05,
        nstep: 36,
        use_mad: false,
    };
    make_qkx2_quants(&p, x, w, l)
}

/// `make_qp_quants`: a non-negative scale for the non-negative values `x` (sub-block scales or mins) on
/// `0..=nmax`, chosen among 9 grids by weighted squared error and refined by up to 5 coordinate sweeps.
/// Writes `L` and returns the scale.
///
/// Kept literal on purpose: `L` is ggml's `uint8_t`, so a (never expected) negative level wraps when
/// stored while the running sums use the unwrapped int.
pub(in crate::quant) fn make_qp_quants(nmax: i32, x: &[f32], l: &mut [u8], qw: &[f32]) -> f32 {
    let mut max = 0.0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for (li, &v) in l.iter_mut().zip(x) {
        *li = nearest_int(iscale * v) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for ((&li, &v), &w) in l.iter().zip(x).zip(qw) {
        let diff = v - scale * li as f32;
        best_mse += w * diff * diff;
    }
    for is in (-4..=4).filter(|&is| is != 0) {
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for (&v, &w) in x.iter().zip(qw) {
            let q = nearest_int(iscale_is * v).min(nmax);
            let diff = v - scale_is * q as f32;
            mse += w * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for ((li, &v), &w) in l.iter_mut().zip(x).zip(qw) {
        let q = nearest_int(iscale * v).min(nmax);
        *li = q as u8;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for ((li, &v), &w) in l.iter_mut().zip(x).zip(qw) {
            let cur = *li as f32;
            let mut slx = sumlx - w * v * cur;
            let mut sl2 = suml2 - w * cur * cur;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(v * sl2 / slx).min(nmax);
                if new_l != *li as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The importance weights of one sub-block: `qw_i · sqrt(sigma2 + x_i²)`.
pub(in crate::quant) fn sigma_weights<const N: usize>(
    sigma2: f32,
    x: &[f32],
    qw: &[f32],
) -> [f32; N] {
    std::array::from_fn(|i| qw[i] * (sigma2 + x[i] * x[i]).sqrt())
}

/// Σ x² in element order.
pub(in crate::quant) fn sum_squares(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// Σ w in element order, from 0 (ggml's `sw[j]`).
pub(in crate::quant) fn sum_in_order(w: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in w {
        s += v;
    }
    s
}
