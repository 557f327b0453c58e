//! The 3-bit lattice formats IQ3_XXS and IQ3_S × Q8_K.
//!
//! A super-block is 8 chunks of 32 elements. Per chunk the 8 grid points are gathered by index from the
//! format's table (4 bytes each, all positive: ≤ 62 for IQ3_XXS, ≤ 15 for IQ3_S) into one vector of u8,
//! and the 32 sign bits become a byte mask that flips the activations instead (`sign_epi8`), so
//! `dot_u8i8_s16` with the chunk's odd scale `2s + 1` as the i16 factor accumulates
//! `Σ scale·|g|·(±y)` exactly in i32 (pair sums ≤ 2·62·127 fit an i16). Per block and token the exact sum
//! is folded to one exact integer `S` and added as `sum += (d_x·d_y)·S`; IQ3_XXS's factor 1/4 is applied
//! once per row. Those are the scalar reference's float steps, so the results equal it bit for bit, and
//! the prefill GEMM's ([`super::iqgemm`]).
//!
//! Unpacking a block (the gathers and sign masks) costs more than its dot product with one token, so
//! the prefill tiles are one row × 16 tokens: each block is unpacked once per 16 tokens.

use core::arch::x86_64::*;

use super::iq4xs::add_block_sums;
use super::{f16_at, loadu, read_f32, read_u32, QuantTile, Simd, StreamPrefetch};
use crate::quant::iq::grids::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};

/// Q8_K: f32 d, then 256 quants.
const AB: usize = 292;
const AQS: usize = 4;

/// One weight block, unpacked: per chunk the grid magnitudes, the sign multipliers (±1 bytes) and the
/// i16 scale broadcast.
#[derive(Clone, Copy)]
pub(super) struct Unpacked {
    pub(super) g: [__m256i; 8],
    pub(super) s: [__m256i; 8],
    pub(super) sc: [__m256i; 8],
}

pub(super) trait Iq3 {
    const WB: usize;
    /// The row's final factor (IQ3_XXS: 1/4).
    const FACTOR: f32;
    unsafe fn unpack(p: *const u8) -> Unpacked;
}

/// ±1 bytes: −1 in byte `e` where bit `e` of `bits` is set.
#[inline(always)]
pub(super) unsafe fn sign_bytes(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    // Byte e takes byte e/8 of `bits`.
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(v, shuf);
    // Byte e of the mask has every bit set except bit e % 8.
    let mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, mask), _mm256_set1_epi8(-1));
    _mm256_or_si256(set, _mm256_set1_epi8(1))
}

/// The 8 grid points `idx(0..8)` of `grid` as 32 bytes.
#[inline(always)]
unsafe fn gather(grid: &[u32], idx: impl Fn(usize) -> usize) -> __m256i {
    _mm256_setr_epi32(
        grid[idx(0)] as i32,
        grid[idx(1)] as i32,
        grid[idx(2)] as i32,
        grid[idx(3)] as i32,
        grid[idx(4)] as i32,
        grid[idx(5)] as i32,
        grid[idx(6)] as i32,
        grid[idx(7)] as i32,
    )
}

pub(crate) struct Iq3Xxs;
pub(crate) struct Iq3S;

impl Iq3 for Iq3Xxs {
    const WB: usize = 98;
    const FACTOR: f32 = 0.25;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        let zero = _mm256_setzero_si256();
        let mut u = Unpacked {
            g: [zero; 8],
            s: [zero; 8],
            sc: [zero; 8],
        };
        let qs = p.add(2);
        for c in 0..8 {
            let aux = read_u32(qs.add(64 + 4 * c));
            let signs = (0..4).fold(0u32, |acc, l| {
                acc | (KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize] as u32) << (8 * l)
            });
            u.g[c] = gather(&IQ3XXS_GRID, |k| *qs.add(8 * c + k) as usize);
            u.s[c] = sign_bytes(signs);
            u.sc[c] = _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16);
        }
        u
    }
}

impl Iq3 for Iq3S {
    const WB: usize = 110;
    const FACTOR: f32 = 1.0;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        let zero = _mm256_setzero_si256();
        let mut u = Unpacked {
            g: [zero; 8],
            s: [zero; 8],
            sc: [zero; 8],
        };
        let (qs, qh, signs, scales) = (p.add(2), p.add(66), p.add(74), p.add(106));
        for c in 0..8 {
            let h = *qh.add(c) as usize;
            u.g[c] = gather(&IQ3S_GRID, |k| {
                *qs.add(8 * c + k) as usize | (((h >> k) & 1) << 8)
            });
            u.s[c] = sign_bytes(read_u32(signs.add(4 * c)));
            let s = (*scales.add(c / 2) >> (4 * (c % 2))) & 0xF;
            u.sc[c] = _mm256_set1_epi16(2 * s as i16 + 1);
        }
        u
    }
}

/// `R` rows × `T` tokens; `prefetch`: the rows are streamed from memory (decode layout).
///
/// # Safety
/// Each `w[r]` must point to `nb` readable blocks of `K::WB` bytes and each `a[t]` to `nb` Q8_K blocks
/// (`quant_rows` checks the slice lengths); every read stays inside those blocks. The CPU must have
/// AVX2, FMA and F16C.
#[inline(always)]
unsafe fn iq3_tile<S: Simd, K: Iq3, const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
    prefetch: bool,
) -> [[f32; T]; R] {
    let zero = _mm256_setzero_si256();
    let mut acc = [[0f32; T]; R];
    let mut pf = StreamPrefetch::new(w);
    for b in 0..nb {
        if prefetch {
            pf.upto((b + 1) * K::WB);
        }
        let mut dx = [0f32; R];
        // A loop, not `array::from_fn`: a closure's body is compiled without this function's target
        // features, so every intrinsic in `unpack` would become a call (the IQ3_S decode ran at a
        // fraction of its speed that way).
        let mut u = [Unpacked {
            g: [zero; 8],
            s: [zero; 8],
            sc: [zero; 8],
        }; R];
        for (r, u) in u.iter_mut().enumerate() {
            let p = w[r].add(b * K::WB);
            dx[r] = f16_at(p);
            *u = K::unpack(p);
        }
        let mut isum = [[zero; T]; R];
        let mut dy = [0f32; T];
        for t in 0..T {
            let ap = a[t].add(b * AB);
            dy[t] = read_f32(ap);
            for c in 0..8 {
                let y = loadu(ap.add(AQS + 32 * c));
                for r in 0..R {
                    let ys = _mm256_sign_epi8(y, u[r].s[c]);
                    isum[r][t] = S::dot_u8i8_s16(isum[r][t], u[r].g[c], ys, u[r].sc[c]);
                }
            }
        }
        add_block_sums(&mut acc, &isum, &dx, &dy);
    }
    if K::FACTOR != 1.0 {
        for row in acc.iter_mut() {
            for v in row.iter_mut() {
                *v *= K::FACTOR;
            }
        }
    }
    acc
}

macro_rules! iq3_tile_impl {
    ($name:ident) => {
        impl QuantTile for $name {
            const WB: usize = <$name as Iq3>::WB;
            const AB: usize = AB;
            #[inline(always)]
            unsafe fn tile<S: Simd, const R: usize, const T: usize>(
                w: [*const u8; R],
                a: [*const u8; T],
                nb: usize,
            ) -> [[f32; T]; R] {
                iq3_tile::<S, $name, R, T>(w, a, nb, false)
            }
            #[inline(always)]
            unsafe fn stream<S: Simd, const R: usize, const T: usize>(
                w: [*const u8; R],
                a: [*const u8; T],
                nb: usize,
            ) -> [[f32; T]; R] {
                iq3_tile::<S, $name, R, T>(w, a, nb, true)
            }
        }
    };
}

iq3_tile_impl!(Iq3Xxs);
iq3_tile_impl!(Iq3S);
