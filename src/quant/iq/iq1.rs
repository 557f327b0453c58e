//! IQ1_S (1.56 bpw) and IQ1_M (1.75 bpw): 8-value points of the 2048-point ternary codebook (−1, 0, 1),
//! shifted by ±[`IQ1S_DELTA`] / ±[`IQ1M_DELTA`] and scaled.
//!
//! IQ1_S: per 32 values four 11-bit indices (low 8 bits in `qs`, high 3 in `qh`), a 3-bit scale and the
//! shift's sign in `qh`. IQ1_M: per 16 values two indices, a 3-bit scale and a shift sign per 8 values,
//! the f16 super-scale spread over the top nibbles of the four u16 `scales`.
//!
//! ggml has no reference quantizer for either (`from_float_ref` is NULL). IQ1_S's quantizer needs weights
//! (llama-quantize refuses it without an importance matrix): [`BlockFormat::quantize`] here runs it with
//! every column's importance 1, which is not a ggml output. IQ1_M's runs without weights (weights `x²`;
//! `ggml_quantize_chunk` accepts that), and [`BlockFormat::quantize`] is that path, byte-identical with
//! ggml (tests/fixtures/iq/ref-IQ1_M.bin). [`ImatrixQuantize`] with weights is byte-identical with
//! `quantize_row_iq1_s_impl` / `quantize_row_iq1_m_impl` (up to the order of equal values, which ggml's
//! unstable `qsort` leaves to the C library; here they keep their position).

use bytemuck::Zeroable;

use super::blocks::{BlockIQ1M, BlockIQ1S};
use super::grids::{IQ1M_DELTA, IQ1S_DELTA, IQ1S_GRID};
use super::lattice::{self, Lattice, Lookup};
use crate::quant::{f16_from_f32, f32_from_f16, nearest_int, BlockFormat, BlockQ8K, GgmlType};
use crate::quant::{ImatrixQuantize, QK_K};

/// ggml's `GROUP_MAX_EPS_IQ1_S` and `GROUP_MAX_EPS_IQ1_M`.
const GROUP_MAX_EPS_IQ1_S: f32 = 1e-12;
const GROUP_MAX_EPS_IQ1_M: f32 = 1e-7;

fn grid(index: usize) -> [i8; 8] {
    IQ1S_GRID[index].to_le_bytes().map(|b| b as i8)
}

impl BlockIQ1S {
    /// Grid index of point `l` (0..32).
    fn index(&self, l: usize) -> usize {
        self.qs[l] as usize | (((self.qh[l / 4] >> (3 * (l % 4))) & 7) as usize) << 8
    }
}

impl BlockIQ1M {
    /// The four u16 scale words.
    fn sc(&self) -> [u16; 4] {
        std::array::from_fn(|k| u16::from_le_bytes([self.scales[2 * k], self.scales[2 * k + 1]]))
    }

    /// The f16 super-scale, from the top nibbles of the scale words.
    fn d(&self) -> f32 {
        let sc = self.sc();
        f32_from_f16(
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000),
        )
    }

    /// Grid index of point `l` (0..32).
    fn index(&self, l: usize) -> usize {
        self.qs[l] as usize | ((self.qh[l / 2] as usize) << (8 - 4 * (l % 2)) & 0x700)
    }

    /// Whether point `l`'s shift is negative.
    fn minus(&self, l: usize) -> bool {
        self.qh[l / 2] & (0x08 << (4 * (l % 2))) != 0
    }

    /// The 3-bit scale of 16-value group `g` (0..16).
    fn scale(&self, g: usize) -> i32 {
        let sc = self.sc();
        let (ib, h) = (g / 2, g % 2);
        ((sc[ib / 2] >> (6 * (ib % 2) + 3 * h)) & 7) as i32
    }
}

impl BlockFormat for BlockIQ1S {
    const TYPE: GgmlType = GgmlType::IQ1_S;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        let ones = vec![1.0f32; x.len()];
        Self::quantize_row_imatrix(x, Some(&ones), out);
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * QK_K, "dequantize: output length");
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f32_from_f16(b.d);
            for ib in 0..QK_K / 32 {
                let qh = b.qh[ib];
                let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
                let delta = if qh & 0x8000 != 0 {
                    -IQ1S_DELTA
                } else {
                    IQ1S_DELTA
                };
                for l in 4 * ib..4 * ib + 4 {
                    for (o, g) in y[8 * l..8 * l + 8].iter_mut().zip(grid(b.index(l))) {
                        *o = dl * (g as f32 + delta);
                    }
                }
            }
        }
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sumf = 0f32;
        for (b, y) in w.iter().zip(a) {
            let (mut sumi, mut sumi1) = (0i32, 0i32);
            for ib in 0..QK_K / 32 {
                let qh = b.qh[ib];
                let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
                let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
                let mut lsum = 0i32;
                for l in 4 * ib..4 * ib + 4 {
                    let q8 = &y.qs[8 * l..8 * l + 8];
                    lsum += grid(b.index(l))
                        .iter()
                        .zip(q8)
                        .map(|(&g, &q)| g as i32 * q as i32)
                        .sum::<i32>();
                }
                sumi += ls * lsum;
                sumi1 += ls * delta * (y.bsums[2 * ib] as i32 + y.bsums[2 * ib + 1] as i32);
            }
            sumf += f32_from_f16(b.d) * y.d * (sumi as f32 + IQ1S_DELTA * sumi1 as f32);
        }
        sumf
    }
}

impl BlockFormat for BlockIQ1M {
    const TYPE: GgmlType = GgmlType::IQ1_M;
    const BLOCK: usize = QK_K;
    type VecDot = BlockQ8K;

    fn quantize(x: &[f32], out: &mut [Self]) {
        Self::quantize_row_imatrix(x, None, out);
    }

    fn dequantize(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * QK_K, "dequantize: output length");
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = b.d();
            for l in 0..QK_K / 8 {
                let dl = d * (2 * b.scale(l / 2) + 1) as f32;
                let delta = if b.minus(l) { -IQ1S_DELTA } else { IQ1S_DELTA };
                for (o, g) in y[8 * l..8 * l + 8].iter_mut().zip(grid(b.index(l))) {
                    *o = dl * (g as f32 + delta);
                }
            }
        }
    }

    fn vec_dot_ref(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sumf = 0f32;
        for (b, y) in w.iter().zip(a) {
            let (mut sumi1, mut sumi2) = (0i32, 0i32);
            for ib in 0..QK_K / 32 {
                let (mut sum1, mut sum2) = ([0i32; 2], [0i32; 2]);
                for l in 4 * ib..4 * ib + 4 {
                    let q8 = &y.qs[8 * l..8 * l + 8];
                    let g = grid(b.index(l));
                    let lsum1: i32 = g.iter().zip(q8).map(|(&g, &q)| g as i32 * q as i32).sum();
                    let lsum2: i32 = q8.iter().map(|&q| q as i32).sum();
                    let delta = if b.minus(l) { -1 } else { 1 };
                    sum1[l % 4 / 2] += lsum1;
                    sum2[l % 4 / 2] += lsum2 * delta;
                }
                let ls1 = 2 * b.scale(2 * ib) + 1;
                let ls2 = 2 * b.scale(2 * ib + 1) + 1;
                sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
                sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
            }
            sumf += b.d() * y.d * (sumi1 as f32 + IQ1M_DELTA * sumi2 as f32);
        }
        sumf
    }
}

impl ImatrixQuantize for BlockIQ1S {
    const NEEDS_IMATRIX: bool = true;

    /// Without weights this is [`BlockFormat::quantize`] (unit importance; ggml has no such path).
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        assert_eq!(x.len(), out.len() * QK_K, "quantize: row length");
        let Some(qw) = qw else {
            return Self::quantize(x, out);
        };
        assert_eq!(qw.len(), x.len(), "quantize: importance length");
        let lat = lattice::iq1s();
        for ((xb, wb), b) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(out) {
            *b = quantize_iq1s_block(lat, xb, wb);
        }
    }
}

impl ImatrixQuantize for BlockIQ1M {
    const NEEDS_IMATRIX: bool = true;

    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]) {
        assert_eq!(x.len(), out.len() * QK_K, "quantize: row length");
        if let Some(qw) = qw {
            assert_eq!(qw.len(), x.len(), "quantize: importance length");
        }
        let lat = lattice::iq1s();
        for (i, (xb, b)) in x.chunks_exact(QK_K).zip(out).enumerate() {
            *b = quantize_iq1m_block(lat, xb, qw.map(|w| &w[QK_K * i..QK_K * (i + 1)]));
        }
    }
}

/// The levels after shifting: `[-1 + δ, δ, 1 + δ]` and `[-1 - δ, -δ, 1 - δ]`.
fn shifted(delta: f32) -> ([f32; 3], [f32; 3]) {
    (
        [-1.0 + delta, delta, 1.0 + delta],
        [-1.0 - delta, -delta, 1.0 - delta],
    )
}

/// The positions of `x` ordered by value (ggml sorts (value, position) pairs by value with `qsort`).
fn order<const N: usize>(x: &[f32]) -> [usize; N] {
    let mut idx: [usize; N] = std::array::from_fn(|i| i);
    idx.sort_by(|&a, &b| x[a].partial_cmp(&x[b]).unwrap_or(std::cmp::Ordering::Equal));
    idx
}

/// ggml's `iq1_find_best_neighbour2`: among `candidates`, the point whose shifted levels `xg` times
/// `scale` are nearest to `x` in weighted distance (the first on ties); writes its levels into `l`.
fn best_neighbour2(
    lat: &Lattice,
    candidates: &[u16],
    x: &[f32],
    w: &[f32],
    scale: f32,
    xg: &[f32; 3],
    l: &mut [i8],
) -> usize {
    let mut best = f32::MAX;
    let mut index = candidates[0] as usize;
    for &j in candidates {
        let p = lat.levels(j as usize);
        let mut d2 = 0f32;
        for i in 0..8 {
            let q = xg[p[i] as usize];
            let diff = scale * q - x[i];
            d2 += w[i] * diff * diff;
        }
        if d2 < best {
            best = d2;
            index = j as usize;
        }
    }
    l[..8].copy_from_slice(&lat.levels(index));
    index
}

/// Grid index of each 8 levels of `l`, moving off-grid ones to their best neighbour (`xx(k)`: the
/// shifted levels of point `k`). Returns the indices and whether all were on the grid.
#[allow(clippy::needless_range_loop)] // k indexes `l`, `x`, `w` by 8s as well as `index`
fn to_grid<const P: usize>(
    lat: &Lattice,
    l: &mut [i8],
    x: &[f32],
    w: &[f32],
    scale: f32,
    xx: impl Fn(usize) -> [f32; 3],
) -> ([usize; P], bool) {
    let mut index = [0usize; P];
    let mut all = true;
    for k in 0..P {
        let r = 8 * k..8 * k + 8;
        index[k] = match lat.lookup(&l[r.clone()]) {
            Lookup::OnGrid(i) => i,
            Lookup::Near(c) => {
                all = false;
                let (xs, ws) = (&x[r.clone()], &w[r.clone()]);
                best_neighbour2(lat, c, xs, ws, scale, &xx(k), &mut l[r])
            }
        };
    }
    (index, all)
}

/// `Σ w·q·x`, `Σ w·q²` over the points `index`, `q` the shifted level of each coordinate.
fn grid_sums(
    lat: &Lattice,
    index: &[usize],
    x: &[f32],
    w: &[f32],
    xx: impl Fn(usize) -> [f32; 3],
) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (k, &i) in index.iter().enumerate() {
        let xg = xx(k);
        for (j, &lv) in lat.levels(i).iter().enumerate() {
            let (wi, q) = (w[8 * k + j], xg[lv as usize]);
            sumqx += wi * q * x[8 * k + j];
            sumq2 += wi * q * q;
        }
    }
    (sumqx, sumq2)
}

/// Levels 0/1/2 of a group from the split points `i1 ≤ i2` of its sorted order.
fn split_levels<const N: usize>(idx: &[usize; N], i1: usize, i2: usize) -> [i8; N] {
    let mut l = [0i8; N];
    for (j, &i) in idx.iter().enumerate() {
        l[i] = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
    }
    l
}

fn abs_max(x: &[f32]) -> f32 {
    x[1..]
        .iter()
        .fold(x[0].abs(), |m, &v| if m > v.abs() { m } else { v.abs() })
}

/// `quantize_row_iq1_s_impl` on one super-block (float order as in ggml, no FMA).
fn quantize_iq1s_block(lat: &Lattice, x: &[f32], qw: &[f32]) -> BlockIQ1S {
    const BS: usize = 32;
    let (x_p, x_m) = shifted(IQ1S_DELTA);
    let mut b = BlockIQ1S::zeroed();
    let mut scales = [0f32; QK_K / BS];
    let mut shifts = [1i8; QK_K / BS];
    let mut max_scale = 0f32;
    let sumx2 = x.iter().fold(0f32, |s, &v| s + v * v);
    let sigma2 = 2.0 * sumx2 / QK_K as f32;
    for ib in 0..QK_K / BS {
        let xb = &x[BS * ib..BS * ib + BS];
        let qwb = &qw[BS * ib..BS * ib + BS];
        let weight: [f32; BS] = std::array::from_fn(|i| qwb[i] * (sigma2 + xb[i] * xb[i]).sqrt());
        if abs_max(xb) < GROUP_MAX_EPS_IQ1_S {
            continue;
        }
        let idx = order::<BS>(xb);
        let (mut sumx, mut sumw) = ([0f32; BS + 1], [0f32; BS + 1]);
        for (j, &i) in idx.iter().enumerate() {
            sumx[j + 1] = sumx[j] + weight[i] * xb[i];
            sumw[j + 1] = sumw[j] + weight[i];
        }
        let mut best_score = -f32::MAX;
        let mut scale = abs_max(xb);
        let mut best: Option<(usize, usize, i8)> = None;
        for i1 in 0..=BS {
            for i2 in i1..=BS {
                for (xs, shift) in [(&x_p, 1i8), (&x_m, -1)] {
                    let sumqx = (sumx[i1] - sumx[0]) * xs[0]
                        + (sumx[i2] - sumx[i1]) * xs[1]
                        + (sumx[BS] - sumx[i2]) * xs[2];
                    let sumq2 = (sumw[i1] - sumw[0]) * xs[0] * xs[0]
                        + (sumw[i2] - sumw[i1]) * xs[1] * xs[1]
                        + (sumw[BS] - sumw[i2]) * xs[2] * xs[2];
                    if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                        scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        best = Some((i1, i2, shift));
                    }
                }
            }
        }
        let Some((i1, i2, mut shift)) = best else {
            continue;
        };
        let mut l = split_levels(&idx, i1, i2);
        if scale < 0.0 {
            l.iter_mut().for_each(|v| *v = 2 - *v);
            scale = -scale;
            shift = -shift;
        }
        let xx = if shift == 1 { x_p } else { x_m };
        let (index, all_on_grid) = to_grid::<4>(lat, &mut l, xb, &weight, scale, |_| xx);
        if !all_on_grid {
            let (sumqx, sumq2) = grid_sums(lat, &index, xb, &weight, |_| xx);
            if sumqx > 0.0 && sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        let mut h = 0u16;
        for (k, &i) in index.iter().enumerate() {
            b.qs[4 * ib + k] = i as u8;
            h |= ((i >> 8) as u16) << (3 * k);
        }
        b.qh[ib] = h;
        scales[ib] = scale;
        shifts[ib] = shift;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    if max_scale == 0.0 {
        return b;
    }
    let d = max_scale / 15.0;
    b.d = f16_from_f32(d * 1.125);
    let id = 1.0 / d;
    for ib in 0..QK_K / BS {
        let mut l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7) as u16;
        if shifts[ib] == -1 {
            l |= 8;
        }
        b.qh[ib] |= l << 12;
    }
    b
}

/// `quantize_row_iq1_m_impl` on one super-block (float order as in ggml, no FMA).
fn quantize_iq1m_block(lat: &Lattice, x: &[f32], qw: Option<&[f32]>) -> BlockIQ1M {
    const BS: usize = 16;
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let (x_p, x_m) = shifted(IQ1M_DELTA);
    // Shift choice k: bit 1 set = first 8 values shifted down, bit 0 set = second 8 values.
    let levels_of = |k: usize, half: usize| -> [f32; 3] {
        let plus = if half == 0 {
            k < 2
        } else {
            k.is_multiple_of(2)
        };
        if plus {
            x_p
        } else {
            x_m
        }
    };
    let mut b = BlockIQ1M::zeroed();
    let mut scales = [0f32; QK_K / BS];
    let mut shifts = [0usize; QK_K / BS];
    let mut max_scale = 0f32;
    let sumx2 = x.iter().fold(0f32, |s, &v| s + v * v);
    let sigma2 = 2.0 * sumx2 / QK_K as f32;
    let weights = |ib: usize| -> [f32; BS] {
        let xb = &x[BS * ib..BS * ib + BS];
        match qw {
            Some(qw) => {
                let qw = &qw[BS * ib..BS * ib + BS];
                std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt())
            }
            None => std::array::from_fn(|i| xb[i] * xb[i]),
        }
    };
    let (p2, m2) = (x_p[2], x_m[2]);
    let cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1];
    let cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2];
    let cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1];
    let cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2];
    for ib in 0..QK_K / BS {
        let xb = &x[BS * ib..BS * ib + BS];
        let weight = weights(ib);
        let max = abs_max(xb);
        if max < GROUP_MAX_EPS_IQ1_M {
            continue;
        }
        let idx = order::<BS>(xb);
        // Prefix sums per half (each half has its own shift).
        let (mut px, mut pw) = ([[0f32; BS + 1]; 2], [[0f32; BS + 1]; 2]);
        for (j, &i) in idx.iter().enumerate() {
            let h = if i < BS / 2 { 0 } else { 1 };
            px[h][j + 1] = px[h][j] + weight[i] * xb[i];
            px[1 - h][j + 1] = px[1 - h][j];
            pw[h][j + 1] = pw[h][j] + weight[i];
            pw[1 - h][j + 1] = pw[1 - h][j];
        }
        let txs = [px[0][BS], px[1][BS]];
        let tws = [pw[0][BS], pw[1][BS]];
        let mut best_score = -f32::MAX;
        let mut scale = max;
        let mut best: Option<(usize, usize, usize)> = None;
        for i1 in 0..=BS {
            for i2 in i1..=BS {
                let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) =
                    ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 2]);
                for h in 0..2 {
                    let sx = px[h][i1] + px[h][i2];
                    qx_p[h] = txs[h] * p2 - sx;
                    qx_m[h] = txs[h] * m2 - sx;
                    q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                    q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                }
                let sumqx = [
                    qx_p[0] + qx_p[1],
                    qx_p[0] + qx_m[1],
                    qx_m[0] + qx_p[1],
                    qx_m[0] + qx_m[1],
                ];
                let sumq2 = [
                    q2_p[0] + q2_p[1],
                    q2_p[0] + q2_m[1],
                    q2_m[0] + q2_p[1],
                    q2_m[0] + q2_m[1],
                ];
                for k in 0..4 {
                    if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                        scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        best = Some((i1, i2, k));
                    }
                }
            }
        }
        let Some((i1, i2, mut best_k)) = best else {
            continue;
        };
        let mut l = split_levels(&idx, i1, i2);
        if scale < 0.0 {
            l.iter_mut().for_each(|v| *v = 2 - *v);
            scale = -scale;
            best_k = 3 - best_k;
        }
        let xx = |k: usize| levels_of(best_k, k);
        let (index, all_on_grid) = to_grid::<2>(lat, &mut l, xb, &weight, scale, xx);
        if !all_on_grid {
            let (sumqx, sumq2) = grid_sums(lat, &index, xb, &weight, xx);
            if sumqx > 0.0 && sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        b.qs[2 * ib] = index[0] as u8;
        b.qs[2 * ib + 1] = index[1] as u8;
        b.qh[ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
        scales[ib] = scale;
        shifts[ib] = best_k;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    if max_scale == 0.0 {
        return b;
    }
    let mut sc = [0u16; 4];
    let mut d = max_scale / 15.0;
    let id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for ib in 0..QK_K / BS {
        let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
        sc[ib / 4] |= (l as u16) << (3 * (ib % 4));
        b.qh[ib] |= MASKS[shifts[ib]];
        let xb = &x[BS * ib..BS * ib + BS];
        let weight = weights(ib);
        for k in 0..2 {
            let xx = levels_of(shifts[ib], k);
            let i = b.qs[2 * ib + k] as usize | ((b.qh[ib] as usize) << (8 - 4 * k) & 0x700);
            for (j, &lv) in lat.levels(i).iter().enumerate() {
                let w = weight[8 * k + j];
                let q = xx[lv as usize] * (2 * l + 1) as f32;
                sumqx += w * q * xb[8 * k + j];
                sumq2 += w * q * q;
            }
        }
    }
    if sumq2 > 0.0 {
        d = sumqx / sumq2;
    }
    let s = f16_from_f32(d * 1.1125);
    sc[0] |= (s & 0x000f) << 12;
    sc[1] |= (s & 0x00f0) << 8;
    sc[2] |= (s & 0x0f00) << 4;
    sc[3] |= s & 0xf000;
    for (k, v) in sc.iter().enumerate() {
        b.scales[2 * k..2 * k + 2].copy_from_slice(&v.to_le_bytes());
    }
    b
}
