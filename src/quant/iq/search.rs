//! Pieces shared by the lattice quantizers (IQ2/IQ1; the neighbour search also IQ3), each a literal
//! transcription of ggml's expression order (f32, left to right, no FMA), as byte identity with
//! llama-quantize needs.

use crate::quant::nearest_int;

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below this is all zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// Per-value importance `qw[i] · sqrt(sigma2 + x[i]²)`.
pub(super) fn rms_weights<const N: usize>(x: &[f32], qw: &[f32], sigma2: f32) -> [f32; N] {
    std::array::from_fn(|i| qw[i] * (sigma2 + x[i] * x[i]).sqrt())
}

/// Writes `|x|` of 8 values into `xval` and returns their 7 stored sign bits: with an odd number of
/// negatives, the value of least `w·x²` (the first on ties) keeps the wrong sign, so the count is even
/// and the eighth sign follows from the other seven.
pub(super) fn parity_signs(x: &[f32], w: &[f32], xval: &mut [f32]) -> u8 {
    let mut s = 0u8;
    let mut nflip = 0;
    for i in 0..8 {
        if x[i] >= 0.0 {
            xval[i] = x[i];
        } else {
            xval[i] = -x[i];
            nflip += 1;
            s |= 1 << i;
        }
    }
    if nflip % 2 == 1 {
        let mut imin = 0;
        let mut min = w[0] * x[0] * x[0];
        for i in 1..8 {
            let ax = w[i] * x[i] * x[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= 1 << imin;
    }
    s & 127
}

/// `(Σ w·x·q, Σ w·q²)` with `q = 2l + 1`.
pub(super) fn levels_sums(w: &[f32], x: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for i in 0..l.len() {
        let q = (2 * l[i] as i32 + 1) as f32;
        sumqx += w[i] * x[i] * q;
        sumq2 += w[i] * q * q;
    }
    (sumqx, sumq2)
}

/// ggml's `make_qp_quants`: a weighted scale for non-negative `x` with levels `0..=nmax` in `l`.
pub(super) fn make_qp_quants(nmax: i32, x: &[f32], l: &mut [u8], w: &[f32]) -> f32 {
    let max = x.iter().fold(0f32, |m, &v| if m > v { m } else { v });
    if max < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for (q, &v) in l.iter_mut().zip(x) {
        *q = nearest_int(iscale * v) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0f32;
    for i in 0..x.len() {
        let diff = x[i] - scale * l[i] as f32;
        best_mse += w[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..x.len() {
            let q = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * q as f32;
            mse += w[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..x.len() {
        let q = nearest_int(iscale * x[i]).min(nmax);
        l[i] = q as u8;
        sumlx += w[i] * x[i] * q as f32;
        suml2 += w[i] * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..x.len() {
            let li = l[i] as f32;
            let mut slx = sumlx - w[i] * x[i] * li;
            let mut sl2 = suml2 - w[i] * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l[i] as i32 {
                    slx += w[i] * x[i] * new_l as f32;
                    sl2 += w[i] * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// ggml's `iq2_find_best_neighbour` / `iq3_find_best_neighbour`: the index of the candidate point
/// minimizing `Σ w_i (scale·p_i − x_i)²`, the first on ties (and the first candidate when no distance is
/// below `f32::MAX`, where ggml aborts, so overflowing input cannot panic).
pub(super) fn nearest_point<const N: usize>(
    points: &[[i8; N]],
    candidates: &[u16],
    x: &[f32],
    w: &[f32],
    scale: f32,
) -> usize {
    let mut best = f32::MAX;
    let mut index = candidates[0] as usize;
    for &j in candidates {
        let p = &points[j as usize];
        let mut d2 = 0f32;
        for i in 0..N {
            let diff = scale * p[i] as f32 - x[i];
            d2 += w[i] * diff * diff;
        }
        if d2 < best {
            best = d2;
            index = j as usize;
        }
    }
    index
}
