//! Nearest-point search on the 8-dimensional IQ2/IQ1 codebooks (ggml's `iq2xs_init_impl` and
//! `iq2_find_best_neighbour`), generic over the grid.
//!
//! A grid point is 8 coordinates, each one of 3 levels `l` (0, 1, 2), here held as `2l + 1`. A candidate
//! point (levels 0..=3 per coordinate) is keyed by its 16-bit code `Σ l_k << 2k`; [`Lattice::lookup`]
//! says whether the code is a grid point, and otherwise lists the grid points at the `nwant` smallest
//! distances from it, in ggml's order (distance, then index), so the quantizers that pick among them
//! reproduce ggml's choices exactly. The tables are built once per grid, on first use.

use std::sync::OnceLock;

use super::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};

/// Codes up to `0xAAAA` (all coordinates at level 2) and ggml's spare entry: its `kmap_size`.
const MAP_SIZE: usize = 43692;

/// A codebook's search tables.
pub struct Lattice {
    /// Each grid point's coordinates as `2l + 1` (ggml's `kgrid_q2xs`).
    points: Vec<[i8; 8]>,
    /// Per code: the grid index (≥ 0), or `-(offset + 1)` into `neighbours` for codes off the grid.
    map: Vec<i32>,
    /// Per off-grid code at its offset: the count `n`, then `n` grid indices.
    neighbours: Vec<u16>,
}

/// The result of looking a code up.
pub enum Lookup<'a> {
    /// The code is grid point `index`.
    OnGrid(usize),
    /// The code is off the grid; these are the candidate grid points, nearest first.
    Near(&'a [u16]),
}

impl Lattice {
    /// Builds the tables for `grid` (8 bytes per point, as in ggml's dequantization tables), whose bytes
    /// take the values `levels[0..3]` for levels 0, 1, 2; `nwant` is how many distinct distances of
    /// neighbours an off-grid code keeps (ggml: 3 for IQ1_S/IQ1_M, 1 for IQ2_S, 2 otherwise).
    pub fn new(grid: &[u64], levels: [u8; 3], nwant: usize) -> Lattice {
        let points: Vec<[i8; 8]> = grid
            .iter()
            .map(|g| {
                let bytes = g.to_le_bytes();
                std::array::from_fn(|k| {
                    let l = levels
                        .iter()
                        .position(|&v| v == bytes[k])
                        .expect("grid byte is one of the levels");
                    2 * l as i8 + 1
                })
            })
            .collect();
        let mut map = vec![-1i32; MAP_SIZE];
        for (i, p) in points.iter().enumerate() {
            map[code_of(p)] = i as i32;
        }
        let mut neighbours = Vec::new();
        let mut dist = vec![0i32; points.len()];
        for (code, slot) in map.iter_mut().enumerate() {
            if *slot >= 0 {
                continue;
            }
            let pos: [i32; 8] = std::array::from_fn(|k| 2 * ((code >> (2 * k)) & 3) as i32 + 1);
            for (d, p) in dist.iter_mut().zip(&points) {
                *d = (0..8).map(|k| (p[k] as i32 - pos[k]).pow(2)).sum();
            }
            *slot = -(neighbours.len() as i32 + 1);
            let start = neighbours.len();
            neighbours.push(0);
            // The nwant smallest distinct distances, each level's points in index order: ggml's sorted
            // (distance, index) list cut after the nwant-th distance.
            let mut last = -1;
            for _ in 0..nwant {
                let Some(next) = dist.iter().copied().filter(|&d| d > last).min() else {
                    break;
                };
                neighbours.extend(
                    dist.iter()
                        .enumerate()
                        .filter(|&(_, &d)| d == next)
                        .map(|(j, _)| j as u16),
                );
                last = next;
            }
            neighbours[start] = (neighbours.len() - start - 1) as u16;
        }
        Lattice {
            points,
            map,
            neighbours,
        }
    }

    /// Number of grid points.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Grid point `i` as `2l + 1` per coordinate.
    pub fn point(&self, i: usize) -> &[i8; 8] {
        &self.points[i]
    }

    /// Grid point `i` as levels `l` (0..=2).
    pub fn levels(&self, i: usize) -> [i8; 8] {
        self.points[i].map(|q| (q - 1) / 2)
    }

    /// Looks up the code of levels `l` (each 0..=3).
    pub fn lookup(&self, l: &[i8]) -> Lookup<'_> {
        let code = l
            .iter()
            .enumerate()
            .fold(0usize, |u, (k, &v)| u | ((v as usize) << (2 * k)));
        let m = self.map[code];
        if m >= 0 {
            Lookup::OnGrid(m as usize)
        } else {
            let at = (-m - 1) as usize;
            let n = self.neighbours[at] as usize;
            Lookup::Near(&self.neighbours[at + 1..at + 1 + n])
        }
    }

    /// The grid index of levels `l`, if they are a grid point.
    pub fn index(&self, l: &[i8]) -> Option<usize> {
        match self.lookup(l) {
            Lookup::OnGrid(i) => Some(i),
            Lookup::Near(_) => None,
        }
    }

    /// ggml's `iq2_find_best_neighbour`: among `candidates`, the point minimizing
    /// `Σ w_i (scale·q_i − x_i)²` (the first on ties); writes its levels into `l` and returns its index.
    pub fn best_neighbour(
        &self,
        candidates: &[u16],
        x: &[f32],
        w: &[f32],
        scale: f32,
        l: &mut [i8],
    ) -> usize {
        let index = super::search::nearest_point(&self.points, candidates, x, w, scale);
        l[..8].copy_from_slice(&self.levels(index));
        index
    }
}

fn code_of(p: &[i8; 8]) -> usize {
    p.iter()
        .enumerate()
        .fold(0, |u, (k, &q)| u | ((((q - 1) / 2) as usize) << (2 * k)))
}

/// Byte values of the IQ2 grids' three levels.
const IQ2_LEVELS: [u8; 3] = [0x08, 0x19, 0x2b];

/// The IQ2_XXS codebook (256 points).
pub fn iq2xxs() -> &'static Lattice {
    static L: OnceLock<Lattice> = OnceLock::new();
    L.get_or_init(|| Lattice::new(&IQ2XXS_GRID, IQ2_LEVELS, 2))
}

/// The IQ2_XS codebook (512 points).
pub fn iq2xs() -> &'static Lattice {
    static L: OnceLock<Lattice> = OnceLock::new();
    L.get_or_init(|| Lattice::new(&IQ2XS_GRID, IQ2_LEVELS, 2))
}

/// The IQ2_S codebook (1024 points).
pub fn iq2s() -> &'static Lattice {
    static L: OnceLock<Lattice> = OnceLock::new();
    L.get_or_init(|| Lattice::new(&IQ2S_GRID, IQ2_LEVELS, 1))
}

/// The IQ1_S/IQ1_M codebook (2048 points of −1, 0, 1).
pub fn iq1s() -> &'static Lattice {
    static L: OnceLock<Lattice> = OnceLock::new();
    L.get_or_init(|| Lattice::new(&IQ1S_GRID, [0xff, 0x00, 0x01], 3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_points_map_to_themselves() {
        for lat in [iq2xxs(), iq2xs(), iq2s(), iq1s()] {
            for i in 0..lat.len() {
                assert_eq!(lat.index(&lat.levels(i)), Some(i));
            }
        }
    }

    #[test]
    fn neighbours_are_the_nearest_points() {
        let lat = iq2xxs();
        // Level 3 is never on the grid; the candidates are at the smallest distances, in order.
        let l = [3i8, 3, 3, 3, 3, 3, 3, 1];
        let Lookup::Near(c) = lat.lookup(&l) else {
            panic!("on grid")
        };
        let d = |j: usize| -> i32 {
            let p = lat.point(j);
            (0..8)
                .map(|k| (p[k] as i32 - (2 * l[k] as i32 + 1)).pow(2))
                .sum()
        };
        let min = (0..lat.len()).map(d).min().unwrap();
        assert_eq!(d(c[0] as usize), min);
        assert!(c
            .windows(2)
            .all(|w| (d(w[0] as usize), w[0]) < (d(w[1] as usize), w[1])));
    }
}
