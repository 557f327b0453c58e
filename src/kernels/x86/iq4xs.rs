//! IQ4_XS × Q8_K: per 32-value sub-block the nibbles are looked up in the level table (`pshufb`), the
//! signed levels enter `maddubs` through the sign trick `|q| · (y·sign q)`, and the pair sums are
//! weighted by the sub-block's 6-bit scale (minus 32) in the same `madd` (`dot_u8i8_s16`). The whole
//! super-block's sum stays in i32 (at most 8 · 32 · 32 · 127 · 127 < 2³¹); per (row, token) it is folded to
//! one exact integer `S` and added as `sum += (d·d8)·S` ([`add_block_sums`]), the float steps the prefill
//! GEMM ([`super::iqgemm`]) takes, so that prefill and decode agree bit for bit.

use core::arch::x86_64::*;

use super::kquants::{fold4, hsum_epi32};
use super::legacy::iq4_levels;
use super::{f16_at, loadu, loadu128, read_f32, read_u16, QuantTile, Simd, StreamPrefetch};

pub(crate) struct IQ4XS;

/// Bytes of an IQ4_XS block: d (f16), scales_h (u16), scales_l (4 bytes), 128 bytes of nibbles.
const WB: usize = 136;
/// Bytes of a Q8_K block: d (f32), 256 quants, 16 i16 sums.
const AB: usize = 292;

/// Sub-block `ib`'s scale of the block at `p`, minus 32.
#[inline(always)]
pub(super) unsafe fn scale(p: *const u8, ib: usize) -> i16 {
    let lo = (*p.add(4 + ib / 2) >> (4 * (ib % 2))) & 0xf;
    let hi = ((read_u16(p.add(2)) >> (2 * ib)) & 3) as u8;
    (lo | (hi << 4)) as i16 - 32
}

/// The 32 levels of sub-block `ib` of the block at `p`, in element order.
#[inline(always)]
pub(super) unsafe fn levels(p: *const u8, ib: usize) -> __m256i {
    let v = loadu128(p.add(8 + 16 * ib));
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(v), v);
    iq4_levels(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)))
}

/// `R` rows × `T` tokens; `prefetch`: the rows stream from memory (decode layout).
#[inline(always)]
unsafe fn xs_tile<S: Simd, const R: usize, const T: usize>(
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
            pf.upto((b + 1) * WB);
        }
        let wb: [*const u8; R] = core::array::from_fn(|r| w[r].add(b * WB));
        let mut isum = [[zero; T]; R];
        for ib in 0..8 {
            let q: [__m256i; R] = core::array::from_fn(|r| levels(wb[r], ib));
            let qa: [__m256i; R] = core::array::from_fn(|r| _mm256_sign_epi8(q[r], q[r]));
            let s: [__m256i; R] = core::array::from_fn(|r| _mm256_set1_epi16(scale(wb[r], ib)));
            for t in 0..T {
                let y = loadu(a[t].add(b * AB + 4 + 32 * ib));
                for r in 0..R {
                    isum[r][t] =
                        S::dot_u8i8_s16(isum[r][t], qa[r], _mm256_sign_epi8(y, q[r]), s[r]);
                }
            }
        }
        let dx: [f32; R] = core::array::from_fn(|r| f16_at(wb[r]));
        let dy: [f32; T] = core::array::from_fn(|t| read_f32(a[t].add(b * AB)));
        add_block_sums(&mut acc, &isum, &dx, &dy);
    }
    acc
}

/// `acc[r][t] += (dx[r]·dy[t])·S` with `S` the lane sum of `isum[r][t]`: a block's exact integer sum, then
/// the float steps of the scalar references of the IQ formats (`sumf += d·bsum`). Every tile shape, and
/// the prefill GEMM ([`super::iqgemm`]), gives a (row, token) the same operations in the same order.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
pub(super) unsafe fn add_block_sums<const R: usize, const T: usize>(
    acc: &mut [[f32; T]; R],
    isum: &[[__m256i; T]; R],
    dx: &[f32; R],
    dy: &[f32; T],
) {
    for t in 0..T {
        let mut s = [0i32; R];
        if R.is_multiple_of(4) {
            for r in (0..R).step_by(4) {
                let v = fold4(core::array::from_fn(|i| isum[r + i][t]));
                _mm_storeu_si128(s[r..].as_mut_ptr() as *mut __m128i, v);
            }
        } else {
            for r in 0..R {
                s[r] = hsum_epi32(isum[r][t]);
            }
        }
        for r in 0..R {
            acc[r][t] += (dx[r] * dy[t]) * s[r] as f32;
        }
    }
}

impl QuantTile for IQ4XS {
    const WB: usize = WB;
    const AB: usize = AB;
    #[inline(always)]
    unsafe fn tile<S: Simd, const R: usize, const T: usize>(
        w: [*const u8; R],
        a: [*const u8; T],
        nb: usize,
    ) -> [[f32; T]; R] {
        xs_tile::<S, R, T>(w, a, nb, T == 1)
    }
    #[inline(always)]
    unsafe fn stream<S: Simd, const R: usize, const T: usize>(
        w: [*const u8; R],
        a: [*const u8; T],
        nb: usize,
    ) -> [[f32; T]; R] {
        xs_tile::<S, R, T>(w, a, nb, true)
    }
}
