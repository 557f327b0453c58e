//! The quantizer side of the 3-bit lattices (IQ3_XXS: 256 points, IQ3_S: 512 points of 4 values):
//! ggml's `iq3xs_init_impl` tables and the 32-value group search that `quantize_row_iq3_xxs_impl` and
//! `quantize_row_iq3_s_impl` share.
//!
//! Each grid point is 4 levels `l ∈ 0..8` (value `2l + 1`). ggml keeps its own list of the points as
//! 12-bit level patterns; that list is the dequantization grid read back through the format's level
//! values (checked once against ggml's `kgrid_256`/`kgrid_512`), so it is derived here from
//! [`IQ3XXS_GRID`] / [`IQ3S_GRID`] rather than copied. Every float expression keeps ggml's order (f32, no
//! FMA) so the quantizers are byte-identical with `llama-quantize`.

use std::sync::OnceLock;

use super::grids::{IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::nearest_int;

/// Patterns of 4 three-bit levels (element `i` in bits `3i..3i+3`).
const PATTERNS: usize = 4096;

/// A lattice's point list, its pattern map and the neighbour lists of the patterns not on it.
pub(super) struct Lattice3 {
    /// Point `k`'s values `2l + 1`.
    grid: Vec<[i8; 4]>,
    /// Per pattern: its point index (≥ 0), or `-(start + 1)` with `neighbours[start]` the count of the
    /// candidate points that follow it (ggml's `kmap_q3xs` / `kneighbors_q3xs` layout).
    map: Vec<i32>,
    neighbours: Vec<u16>,
}

/// The IQ3_XXS lattice (256 points, neighbours within the 2 nearest distances).
pub(super) fn iq3xxs() -> &'static Lattice3 {
    static L: OnceLock<Lattice3> = OnceLock::new();
    L.get_or_init(|| Lattice3::new(&IQ3XXS_GRID, &[4, 12, 20, 28, 36, 44, 52, 62], 2))
}

/// The IQ3_S lattice (512 points, neighbours within the 3 nearest distances).
pub(super) fn iq3s() -> &'static Lattice3 {
    static L: OnceLock<Lattice3> = OnceLock::new();
    L.get_or_init(|| Lattice3::new(&IQ3S_GRID, &[1, 3, 5, 7, 9, 11, 13, 15], 3))
}

impl Lattice3 {
    /// `dequant`: the format's grid (4 byte values per entry), `levels`: its 8 byte values in level
    /// order, `nwant`: how many distinct distances a neighbour list spans.
    fn new(dequant: &[u32], levels: &[u8; 8], nwant: usize) -> Lattice3 {
        let grid: Vec<[i8; 4]> = dequant
            .iter()
            .map(|&e| {
                std::array::from_fn(|i| {
                    let b = (e >> (8 * i)) as u8;
                    let l = levels.iter().position(|&v| v == b).expect("grid value") as i8;
                    2 * l + 1
                })
            })
            .collect();
        let mut map = vec![-1i32; PATTERNS];
        for (k, p) in grid.iter().enumerate() {
            map[pattern(&p.map(|v| (v - 1) / 2))] = k as i32;
        }
        // Off-grid patterns: every point sorted by (squared distance, index), cut after the `nwant`-th
        // distinct distance.
        let mut neighbours = Vec::new();
        let mut dist: Vec<(i32, u16)> = Vec::with_capacity(grid.len());
        for (u, m) in map.iter_mut().enumerate() {
            if *m >= 0 {
                continue;
            }
            let pos: [i32; 4] = std::array::from_fn(|k| 2 * ((u >> (3 * k)) & 7) as i32 + 1);
            dist.clear();
            dist.extend(grid.iter().enumerate().map(|(j, pg)| {
                let d2 = (0..4).map(|k| (pg[k] as i32 - pos[k]).pow(2)).sum::<i32>();
                (d2, j as u16)
            }));
            dist.sort_unstable();
            let start = neighbours.len();
            *m = -(start as i32 + 1);
            neighbours.push(0);
            let (mut d2, mut nhave) = (dist[0].0, 1);
            for &(d, j) in &dist {
                if d > d2 {
                    if nhave == nwant {
                        break;
                    }
                    d2 = d;
                    nhave += 1;
                }
                neighbours.push(j);
            }
            neighbours[start] = (neighbours.len() - start - 1) as u16;
        }
        Lattice3 {
            grid,
            map,
            neighbours,
        }
    }

    /// The point index of 4 levels, if they are a point.
    fn index(&self, l: &[i8]) -> Result<usize, &[u16]> {
        let m = self.map[pattern(l)];
        if m >= 0 {
            Ok(m as usize)
        } else {
            let start = (-m - 1) as usize;
            let n = self.neighbours[start] as usize;
            Err(&self.neighbours[start + 1..start + 1 + n])
        }
    }

    /// The levels of point `k`.
    fn levels(&self, k: usize) -> [i8; 4] {
        self.grid[k].map(|v| (v - 1) / 2)
    }

    /// ggml's `iq3_find_best_neighbour`: the candidate minimizing Σ w·(scale·q − x)², its levels written to
    /// `l`. ggml aborts when no distance is below `FLT_MAX` (overflowing inputs); this takes the first
    /// candidate then, so bad input cannot panic.
    fn best_neighbour(
        &self,
        cands: &[u16],
        x: &[f32],
        w: &[f32],
        scale: f32,
        l: &mut [i8],
    ) -> usize {
        let index = super::search::nearest_point(&self.grid, cands, x, w, scale);
        l[..4].copy_from_slice(&self.levels(index));
        index
    }
}

fn pattern(l: &[i8]) -> usize {
    (0..4).fold(0, |u, i| u | ((l[i] as usize) << (3 * i)))
}

/// Which of ggml's two variants of the group search runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    /// IQ3_XXS: an even count of negatives per 8 (7 stored sign bits), groups below 1e-8 are zero, scale
    /// steps −15..=15, the final pass redoes only the groups that were off the grid.
    Xxs,
    /// IQ3_S: 8 stored sign bits, only all-zero groups are zero, steps −9..=9, the final pass redoes all.
    S,
}

/// A quantized group of 32 values: its scale, the 8 point indices and 4 sign bytes (element `8k + i`
/// negative when bit `i` of `signs[k]` is set; 7 bits for IQ3_XXS).
pub(super) struct Group {
    pub scale: f32,
    pub index: [u16; 8],
    pub signs: [u8; 4],
}

/// The per-32-values body of `quantize_row_iq3_xxs_impl` / `quantize_row_iq3_s_impl`: signs split off,
/// a scan of 2·steps+1 trial scales with each 4-value part rounded onto the lattice (or its best
/// neighbour), then a final re-rounding with the best scale. `None` for a group ggml leaves at zero.
pub(super) fn quantize_group(
    lat: &Lattice3,
    v: Variant,
    xb: &[f32],
    weight: &[f32; 32],
) -> Option<Group> {
    const KMAXQ: i32 = 8;
    let waux: [f32; 32] = std::array::from_fn(|i| weight[i].sqrt());
    let mut xval = [0.0f32; 32];
    let mut signs = [0u8; 4];
    for k in 0..4 {
        let (mut s, mut nflip) = (0u8, 0);
        for i in 0..8 {
            let x = xb[8 * k + i];
            if x >= 0.0 {
                xval[8 * k + i] = x;
            } else {
                xval[8 * k + i] = -x;
                nflip += 1;
                s |= 1 << i;
            }
        }
        if v == Variant::Xxs && nflip % 2 == 1 {
            // Flip the least important element so the count of negatives is even.
            let ax = |i: usize| weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
            let (mut imin, mut min) = (0, ax(0));
            for i in 1..8 {
                if ax(i) < min {
                    min = ax(i);
                    imin = i;
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            s ^= 1 << imin;
        }
        signs[k] = if v == Variant::Xxs { s & 127 } else { s };
    }
    let mut max = xval[0];
    for &x in &xval[1..] {
        max = if max > x { max } else { x };
    }
    let zero = match v {
        Variant::Xxs => max < 1e-8,
        Variant::S => max == 0.0,
    };
    if zero {
        return None;
    }

    let (steps, start_on_grid) = match v {
        Variant::Xxs => (15, true),
        Variant::S => (9, false),
    };
    let sums = |l: &[i8; 32]| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for i in 0..32 {
            let w = weight[i];
            let q = (2 * l[i] as i32 + 1) as f32;
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let round = |id: f32, x: f32| nearest_int(0.5 * (id * x - 1.0)).clamp(0, KMAXQ - 1) as i8;

    let mut l = [0i8; 32];
    let mut laux = [0i8; 32];
    let mut best = 0.0f32;
    let mut scale = max / (2 * KMAXQ - 1) as f32;
    let mut on_grid = [start_on_grid; 8];
    let mut on_grid_aux = [true; 8];
    for is in -steps..=steps {
        let id = ((2 * KMAXQ - 1) as f32 + is as f32 * 0.2) / max;
        let this_scale = 1.0 / id;
        for k in 0..8 {
            for i in 0..4 {
                laux[4 * k + i] = round(id, xval[4 * k + i]);
            }
            on_grid_aux[k] = true;
            if let Err(cands) = lat.index(&laux[4 * k..4 * k + 4]) {
                on_grid_aux[k] = false;
                let r = 4 * k..4 * k + 4;
                lat.best_neighbour(
                    cands,
                    &xval[r.clone()],
                    &waux[r.clone()],
                    this_scale,
                    &mut laux[r],
                );
            }
        }
        let (sumqx, sumq2) = sums(&laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            on_grid = on_grid_aux;
        }
    }

    if on_grid.contains(&false) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..8 {
            if v == Variant::Xxs && on_grid[k] {
                continue;
            }
            let r = 4 * k..4 * k + 4;
            let mut lk = [0i8; 4];
            for i in 0..4 {
                lk[i] = round(id, xval[4 * k + i]);
            }
            let index = match lat.index(&lk) {
                Ok(index) => index,
                Err(cands) => lat.best_neighbour(
                    cands,
                    &xval[r.clone()],
                    &waux[r.clone()],
                    scale,
                    &mut l[r.clone()],
                ),
            };
            l[r].copy_from_slice(&lat.levels(index));
        }
        let (sumqx, sumq2) = sums(&l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    if scale < 0.0 {
        // ggml: "should never happen"; a negative scale is stored positive with the signs flipped.
        scale = -scale;
        for s in &mut signs {
            *s = if v == Variant::Xxs { !*s & 127 } else { !*s };
        }
    }
    // Every part of `l` is a lattice point: taken from the map or from a neighbour list.
    let index = std::array::from_fn(|k| lat.index(&l[4 * k..4 * k + 4]).unwrap_or(0) as u16);
    Some(Group {
        scale,
        index,
        signs,
    })
}

/// The importance weights of one 32-value group, as both quantizers form them: `qw·sqrt(σ² + x²)` with
/// an importance matrix (`sigma2 = 2·Σx²/256` over the super-block), else `x²`.
pub(super) fn group_weights(xb: &[f32], qw: Option<&[f32]>, sigma2: f32) -> [f32; 32] {
    match qw {
        Some(qw) => std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt()),
        None => std::array::from_fn(|i| xb[i] * xb[i]),
    }
}

/// `2·Σx²/256` over a super-block, summed in element order.
pub(super) fn sigma2(xbl: &[f32]) -> f32 {
    let mut sumx2 = 0.0f32;
    for &x in xbl {
        sumx2 += x * x;
    }
    2.0 * sumx2 / xbl.len() as f32
}

/// A super-block scale's 4-bit code: `nearest_int(0.5·(id·scale − 1))` in 0..=15.
pub(super) fn scale_code(id: f32, scale: f32) -> u8 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_have_ggml_shape() {
        for (lat, n) in [(iq3xxs(), 256), (iq3s(), 512)] {
            assert_eq!(lat.grid.len(), n);
            let on = lat.map.iter().filter(|&&m| m >= 0).count();
            assert_eq!(on, n, "every point has its own pattern");
            for u in 0..PATTERNS {
                let l: [i8; 4] = std::array::from_fn(|i| ((u >> (3 * i)) & 7) as i8);
                match lat.index(&l) {
                    Ok(k) => assert_eq!(lat.levels(k), l),
                    Err(c) => assert!(!c.is_empty() && c.iter().all(|&j| (j as usize) < n)),
                }
            }
        }
        // The first IQ3_XXS point is (0,0,0,0); IQ3_S's 511th is levels (7,7,0,0).
        assert_eq!(iq3xxs().levels(0), [0; 4]);
        assert_eq!(iq3s().levels(511), [0, 0, 7, 7]);
    }
}
