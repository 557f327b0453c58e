//! The lattice formats IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M × Q8_K.
//!
//! The kernels run in `quant_rows`' tiles (decode: 4 row stripes with software prefetch; prefill: one
//! row × 16 tokens, so each block is unpacked once for 16 tokens). Unpacking a block dominates its cost
//! in decode, so it is done with vector instructions for the whole block: the grid indices are formed
//! in vector lanes and the grid points (8 bytes each) fetched with gathers, and the sign bits become
//! byte masks (AVX-512: a 64-bit `k` mask per 64 values, applied by a masked `0 − y`; AVX2: ±1 bytes
//! for `sign_epi8`). The weights' signs go onto the activations, so `maddubs` multiplies unsigned grid
//! bytes (≤ 43) with signed activations; Q8_K activations lie in −127..=127, so negating them cannot
//! overflow, and pairs of products fit i16. The scales (odd, ≤ 31) are the i16 factors of
//! `madd`/`vpdpwssd`. IQ1: the grid bytes are −1, 0 or 1, so `sign_epi8(y, grid)` is already the
//! product. The i32 sums are exact, and the float steps per block and token are the scalar reference's
//! in its order, so the results are bit-identical to `vec_dot_ref`.

use core::arch::x86_64::*;

use super::{
    f16_at, loadu, loadu128, read_f32, read_u16, read_u32, QuantTile, Simd, StreamPrefetch,
};
use crate::quant::iq::grids::{
    IQ1M_DELTA, IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID,
};

/// Bytes of a Q8_K block, and the offset of its quants.
const AB: usize = 292;
const AQS: usize = 4;

#[inline(always)]
unsafe fn read_u64(p: *const u8) -> u64 {
    u64::from_le_bytes(core::ptr::read_unaligned(p as *const [u8; 8]))
}

/// ±1 bytes from 32 sign bits: byte `8l + j` is −1 where bit `j` of byte `l` of `s` is set.
#[inline(always)]
unsafe fn sign_bytes(s: u32) -> __m256i {
    let v = _mm256_set1_epi32(s as i32);
    // Byte e takes byte e/8 of s (each 128-bit lane holds all four bytes of the broadcast).
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(v, shuf);
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bits), bits);
    _mm256_or_si256(set, _mm256_set1_epi8(1))
}

/// The four grid points `g` as 32 unsigned bytes, point 0 lowest.
#[inline(always)]
unsafe fn grid_bytes(g: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64)
}

/// The grid points at the four i32 indices `idx`, point 0 lowest (AVX2 gather).
#[inline(always)]
unsafe fn gather4(grid: &[u64], idx: __m128i) -> __m256i {
    _mm256_i32gather_epi64::<8>(grid.as_ptr() as *const i64, idx)
}

/// The grid points at the 16 i32 indices `idx`, as two vectors of 8 (point 0 lowest).
#[inline(always)]
unsafe fn gather16(grid: &[u64], idx: __m512i) -> (__m512i, __m512i) {
    let base = grid.as_ptr() as *const i64;
    (
        _mm512_i32gather_epi64::<8>(_mm512_castsi512_si256(idx), base),
        _mm512_i32gather_epi64::<8>(_mm512_extracti64x4_epi64::<1>(idx), base),
    )
}

#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// `ksigns_iq2xs` for 32 bytes of 7-bit sign codes: the code with its parity as bit 7 (an even number
/// of minus signs per 8 values), by two nibble lookups.
#[inline(always)]
unsafe fn ksigns32(codes: __m256i) -> __m256i {
    // Byte i: 0x80 when i has an odd number of bits set.
    let par = _mm256_setr_epi8(
        0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0, 0, -128, -128, 0,
        -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
    );
    let nib = _mm256_set1_epi8(0x0F);
    let lo = _mm256_shuffle_epi8(par, _mm256_and_si256(codes, nib));
    let hi = _mm256_shuffle_epi8(par, _mm256_and_si256(_mm256_srli_epi16::<4>(codes), nib));
    _mm256_or_si256(codes, _mm256_xor_si256(lo, hi))
}

/// `[e(0), e(1), …]` spelled out, for arrays of vectors: an `array::from_fn` closure's body does not
/// inherit the caller's target features, so the intrinsics in it would become calls.
macro_rules! each {
    (4, |$c:ident| $e:expr) => {
        [{ let $c = 0usize; $e }, { let $c = 1usize; $e }, { let $c = 2usize; $e }, { let $c = 3usize; $e }]
    };
    (8, |$c:ident| $e:expr) => {
        [
            { let $c = 0usize; $e }, { let $c = 1usize; $e }, { let $c = 2usize; $e }, { let $c = 3usize; $e },
            { let $c = 4usize; $e }, { let $c = 5usize; $e }, { let $c = 6usize; $e }, { let $c = 7usize; $e },
        ]
    };
}

/// The u32 lanes of `v`.
#[inline(always)]
unsafe fn lanes_u32(v: __m256i) -> [u32; 8] {
    core::mem::transmute(v)
}

/// A block unpacked for 256-bit vectors, per group of 32 values: grid bytes, ±1 sign bytes, and the
/// scales as i16 factors (one per 16 values: u32 lanes 0..4 and 4..8).
pub(crate) struct Groups {
    g: [__m256i; 8],
    s: [__m256i; 8],
    sc: [__m256i; 8],
}

/// A block unpacked for 512-bit vectors, per pair of groups (64 values): grid bytes, the sign bits as a
/// byte mask, and the scales as i16 factors, one per u32 lane (4 values).
pub(crate) struct Pairs {
    g: [__m512i; 4],
    m: [u64; 4],
    sc: [__m512i; 4],
}

impl Groups {
    /// Σ scale·grid·(±y) over the block, `y`: the Q8_K quants.
    #[inline(always)]
    unsafe fn dot<S: Simd>(&self, y: *const u8) -> i32 {
        let mut acc = _mm256_setzero_si256();
        for c in 0..8 {
            let ys = _mm256_sign_epi8(loadu(y.add(32 * c)), self.s[c]);
            acc = S::dot_u8i8_s16(acc, self.g[c], ys, self.sc[c]);
        }
        hsum_epi32(acc)
    }
}

impl Pairs {
    /// As [`Groups::dot`].
    #[inline(always)]
    unsafe fn dot(&self, y: *const u8) -> i32 {
        let zero = _mm512_setzero_si512();
        let mut acc = zero;
        for k in 0..4 {
            let y = _mm512_loadu_si512(y.add(64 * k) as *const _);
            let ys = _mm512_mask_sub_epi8(y, self.m[k], zero, y);
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(self.g[k], ys), self.sc[k]);
        }
        _mm512_reduce_add_epi32(acc)
    }
}

/// `s | s << 16` per lane: an i16 factor for both halves of each u32 lane.
#[inline(always)]
unsafe fn pair16(s: __m256i) -> __m256i {
    _mm256_or_si256(s, _mm256_slli_epi32::<16>(s))
}

/// The 16 scales of 8 bytes of nibble pairs (low nibble first) as `2s + 1` i16 pairs, u32 lane h from
/// nibble h; then for pair k the vector whose u32 lane i has scale 4k + i/4.
#[inline(always)]
unsafe fn nibble_scales512(p: *const u8) -> [__m512i; 4] {
    let b = _mm_loadl_epi64(p as *const __m128i);
    let rep = _mm_shuffle_epi8(
        b,
        _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
    );
    let v = _mm512_srlv_epi32(
        _mm512_cvtepu8_epi32(rep),
        _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4),
    );
    let v = _mm512_and_si512(v, _mm512_set1_epi32(0xF));
    let v = _mm512_add_epi32(_mm512_slli_epi32::<1>(v), _mm512_set1_epi32(1));
    let all = _mm512_or_si512(v, _mm512_slli_epi32::<16>(v));
    let lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    each!(4, |k| {
        _mm512_permutexvar_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(4 * k as i32)), all)
    })
}

/// The scales of group `ib` for 256-bit vectors: the low nibble for its first 16 values (lanes 0..4),
/// the high for the rest, as i16 pairs.
#[inline(always)]
unsafe fn half_scales(sc: u8) -> __m256i {
    let (lo, hi) = (2 * (sc & 0xf) as i32 + 1, 2 * (sc >> 4) as i32 + 1);
    pair16(_mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi))
}

/// The two-bit formats: one block unpacked either way.
pub(crate) trait Lattice2 {
    const WB: usize;
    unsafe fn groups(p: *const u8) -> Groups;
    unsafe fn pairs(p: *const u8) -> Pairs;
}

/// One weight format: block bytes and its terms of the row sums.
pub(crate) trait Iq2 {
    const WB: usize;
    /// The factor of the row's sum (IQ2: 1/8).
    const ROW_SCALE: f32;
    /// One block's term of each token's row sum (`w`, `a[t]`: the whole blocks), as the scalar
    /// reference forms it.
    unsafe fn terms<S: Simd, const T: usize>(w: *const u8, a: &[*const u8; T]) -> [f32; T];
}

impl<K: Lattice2> Iq2 for K {
    const WB: usize = <K as Lattice2>::WB;
    const ROW_SCALE: f32 = 0.125;
    #[inline(always)]
    unsafe fn terms<S: Simd, const T: usize>(w: *const u8, a: &[*const u8; T]) -> [f32; T] {
        // Loops, not `array::from_fn` closures: a closure's body does not inherit the caller's target
        // features, so the intrinsics inside it would become calls (measured 3.5× slower decode).
        let mut isum = [0i32; T];
        if S::WIDE {
            let u = K::pairs(w);
            for t in 0..T {
                isum[t] = u.dot(a[t].add(AQS));
            }
        } else {
            let u = K::groups(w);
            for t in 0..T {
                isum[t] = u.dot::<S>(a[t].add(AQS));
            }
        }
        let dx = f16_at(w);
        let mut out = [0f32; T];
        for t in 0..T {
            let d = dx * read_f32(a[t]);
            out[t] = d * isum[t] as f32;
        }
        out
    }
}

pub(crate) struct Iq2Xxs;
pub(crate) struct Iq2Xs;
pub(crate) struct Iq2S;

/// IQ2_XXS's 8 index words and 8 sign/scale words (each group: 8 bytes, index word first), from the
/// block's codes `q`, in group order.
#[inline(always)]
unsafe fn xxs_words(q: *const u8) -> (__m256i, __m256i) {
    let (v0, v1) = (
        _mm256_castsi256_ps(loadu(q)),
        _mm256_castsi256_ps(loadu(q.add(32))),
    );
    // Per 128-bit lane: words 0, 2 of v0 then of v1 (groups 0, 1, 4, 5 | 2, 3, 6, 7); then the
    // 64-bit quarters in group order.
    let idx = _mm256_castps_si256(_mm256_shuffle_ps::<0b10_00_10_00>(v0, v1));
    let sgn = _mm256_castps_si256(_mm256_shuffle_ps::<0b11_01_11_01>(v0, v1));
    (
        _mm256_permute4x64_epi64::<0b11_01_10_00>(idx),
        _mm256_permute4x64_epi64::<0b11_01_10_00>(sgn),
    )
}

/// The sign bytes of 8 IQ2_XXS sign words: byte `4g + l` is `ksigns_iq2xs[(a_g >> 7l) & 127]`.
#[inline(always)]
unsafe fn xxs_signs(a: __m256i) -> __m256i {
    let f = |sh: i32, m: i32| {
        _mm256_and_si256(
            _mm256_sllv_epi32(a, _mm256_set1_epi32(sh)),
            _mm256_set1_epi32(m),
        )
    };
    let codes = _mm256_or_si256(
        _mm256_or_si256(f(0, 0x7f), f(1, 0x7f00)),
        _mm256_or_si256(f(2, 0x7f_0000), f(3, 0x7f00_0000)),
    );
    ksigns32(codes)
}

/// `2s + 1` from the top nibble of each sign word, as i16 pairs.
#[inline(always)]
unsafe fn xxs_scales(a: __m256i) -> __m256i {
    let s = _mm256_srli_epi32::<28>(a);
    pair16(_mm256_add_epi32(
        _mm256_add_epi32(s, s),
        _mm256_set1_epi32(1),
    ))
}

impl Lattice2 for Iq2Xxs {
    const WB: usize = 66;
    #[inline(always)]
    unsafe fn groups(p: *const u8) -> Groups {
        let (idx, sgn) = xxs_words(p.add(2));
        let signs = lanes_u32(xxs_signs(sgn));
        let scales = lanes_u32(xxs_scales(sgn));
        let idx = lanes_u32(idx);
        Groups {
            g: each!(8, |c| {
                gather4(
                    &IQ2XXS_GRID,
                    _mm_cvtepu8_epi32(_mm_cvtsi32_si128(idx[c] as i32)),
                )
            }),
            s: each!(8, |c| sign_bytes(signs[c])),
            sc: each!(8, |c| _mm256_set1_epi32(scales[c] as i32)),
        }
    }
    #[inline(always)]
    unsafe fn pairs(p: *const u8) -> Pairs {
        let v = _mm512_loadu_si512(p.add(2) as *const _);
        let idx = _mm512_cvtepi64_epi32(v);
        let sgn = _mm512_cvtepi64_epi32(_mm512_srli_epi64::<32>(v));
        let (g0, g1) = gather16(
            &IQ2XXS_GRID,
            _mm512_cvtepu8_epi32(_mm256_castsi256_si128(idx)),
        );
        let (g2, g3) = gather16(
            &IQ2XXS_GRID,
            _mm512_cvtepu8_epi32(_mm256_extracti128_si256::<1>(idx)),
        );
        let m: [u64; 4] = core::mem::transmute(xxs_signs(sgn));
        // Pair k: u32 lanes 0..8 group 2k, 8..16 group 2k + 1.
        let sc = _mm512_castsi256_si512(xxs_scales(sgn));
        let half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        Pairs {
            g: [g0, g1, g2, g3],
            m,
            sc: each!(4, |k| {
                _mm512_permutexvar_epi32(
                    _mm512_add_epi32(half, _mm512_set1_epi32(2 * k as i32)),
                    sc,
                )
            }),
        }
    }
}

/// IQ2_XS's 32 sign bytes (`ksigns_iq2xs` of each code word's top 7 bits), from the 32 code words `q`.
#[inline(always)]
unsafe fn xs_signs(q: *const u8) -> __m256i {
    let lo = _mm256_srli_epi16::<9>(loadu(q));
    let hi = _mm256_srli_epi16::<9>(loadu(q.add(32)));
    // packus interleaves the 128-bit lanes: (lo0, hi0 | lo1, hi1) → quarters 0, 2, 1, 3.
    let codes = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(lo, hi));
    ksigns32(codes)
}

impl Lattice2 for Iq2Xs {
    const WB: usize = 74;
    #[inline(always)]
    unsafe fn groups(p: *const u8) -> Groups {
        let q = p.add(2);
        let signs = lanes_u32(xs_signs(q));
        let mask = _mm_set1_epi32(511);
        Groups {
            g: each!(8, |c| {
                let w = _mm_cvtepu16_epi32(_mm_loadl_epi64(q.add(8 * c) as *const __m128i));
                gather4(&IQ2XS_GRID, _mm_and_si128(w, mask))
            }),
            s: each!(8, |c| sign_bytes(signs[c])),
            sc: each!(8, |c| half_scales(*p.add(66 + c))),
        }
    }
    #[inline(always)]
    unsafe fn pairs(p: *const u8) -> Pairs {
        let q = p.add(2);
        let mask = _mm512_set1_epi32(511);
        let (g0, g1) = gather16(
            &IQ2XS_GRID,
            _mm512_and_si512(_mm512_cvtepu16_epi32(loadu(q)), mask),
        );
        let (g2, g3) = gather16(
            &IQ2XS_GRID,
            _mm512_and_si512(_mm512_cvtepu16_epi32(loadu(q.add(32))), mask),
        );
        Pairs {
            g: [g0, g1, g2, g3],
            m: core::mem::transmute::<__m256i, [u64; 4]>(xs_signs(q)),
            sc: nibble_scales512(p.add(66)),
        }
    }
}

/// IQ2_S's grid indices of 16 points (groups 4h..4h + 4) as i32: the code byte, and bits 2l, 2l + 1
/// of the group's `qh` byte as bits 8, 9 (point l of the group).
#[inline(always)]
unsafe fn s_indices512(p: *const u8, h: usize) -> __m512i {
    let lo = _mm512_cvtepu8_epi32(loadu128(p.add(2 + 16 * h)));
    let qh = _mm_set1_epi32(read_u32(p.add(66 + 4 * h)) as i32);
    let rep = _mm_shuffle_epi8(
        qh,
        _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
    );
    let hi = _mm512_sllv_epi32(
        _mm512_cvtepu8_epi32(rep),
        _mm512_setr_epi32(8, 6, 4, 2, 8, 6, 4, 2, 8, 6, 4, 2, 8, 6, 4, 2),
    );
    _mm512_or_si512(lo, _mm512_and_si512(hi, _mm512_set1_epi32(0x300)))
}

impl Lattice2 for Iq2S {
    const WB: usize = 82;
    #[inline(always)]
    unsafe fn groups(p: *const u8) -> Groups {
        let (qs, qh, signs, scales) = (p.add(2), p.add(66), p.add(34), p.add(74));
        let shift = _mm_setr_epi32(8, 6, 4, 2);
        Groups {
            g: each!(8, |c| {
                let lo = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(read_u32(qs.add(4 * c)) as i32));
                let hi = _mm_sllv_epi32(_mm_set1_epi32(*qh.add(c) as i32), shift);
                let idx = _mm_or_si128(lo, _mm_and_si128(hi, _mm_set1_epi32(0x300)));
                gather4(&IQ2S_GRID, idx)
            }),
            s: each!(8, |c| sign_bytes(read_u32(signs.add(4 * c)))),
            sc: each!(8, |c| half_scales(*scales.add(c))),
        }
    }
    #[inline(always)]
    unsafe fn pairs(p: *const u8) -> Pairs {
        let (g0, g1) = gather16(&IQ2S_GRID, s_indices512(p, 0));
        let (g2, g3) = gather16(&IQ2S_GRID, s_indices512(p, 1));
        Pairs {
            g: [g0, g1, g2, g3],
            m: each!(4, |k| read_u64(p.add(34 + 8 * k))),
            sc: nibble_scales512(p.add(74)),
        }
    }
}

pub(crate) struct Iq1S;

impl Iq2 for Iq1S {
    const WB: usize = 50;
    const ROW_SCALE: f32 = 1.0;
    #[inline(always)]
    unsafe fn terms<S: Simd, const T: usize>(w: *const u8, a: &[*const u8; T]) -> [f32; T] {
        core::array::from_fn(|t| Self::block_term(w, a[t]))
    }
}

impl Iq1S {
    /// One block × one token (AVX2), as the scalar reference forms it.
    #[inline(always)]
    unsafe fn block_term(w: *const u8, a: *const u8) -> f32 {
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for ib in 0..8 {
            let qh = read_u16(w.add(34 + 2 * ib));
            let g = std::array::from_fn(|l| {
                IQ1S_GRID[*w.add(2 + 4 * ib + l) as usize | (((qh >> (3 * l)) & 7) as usize) << 8]
            });
            let prod = _mm256_sign_epi8(loadu(a.add(AQS + 32 * ib)), grid_bytes(g));
            let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), prod);
            let lsum = hsum_epi32(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
            let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            let bsums = read_u16(a.add(260 + 4 * ib)) as i16 as i32
                + read_u16(a.add(262 + 4 * ib)) as i16 as i32;
            sumi += ls * lsum;
            sumi1 += ls * delta * bsums;
        }
        f16_at(w) * read_f32(a) * (sumi as f32 + IQ1S_DELTA * sumi1 as f32)
    }
}

pub(crate) struct Iq1M;

impl Iq2 for Iq1M {
    const WB: usize = 56;
    const ROW_SCALE: f32 = 1.0;
    #[inline(always)]
    unsafe fn terms<S: Simd, const T: usize>(w: *const u8, a: &[*const u8; T]) -> [f32; T] {
        core::array::from_fn(|t| Self::block_term(w, a[t]))
    }
}

impl Iq1M {
    /// One block × one token (AVX2), as the scalar reference forms it.
    #[inline(always)]
    unsafe fn block_term(w: *const u8, a: *const u8) -> f32 {
        let sc: [u16; 4] = std::array::from_fn(|k| read_u16(w.add(48 + 2 * k)));
        let d16 =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        let d = f16_at(d16.to_le_bytes().as_ptr());
        let ones = _mm256_set1_epi8(1);
        let (mut acc1, mut acc2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for ib in 0..8 {
            let (qs, qh) = (w.add(4 * ib), w.add(32 + 2 * ib));
            let g = std::array::from_fn(|l| {
                let h = (*qh.add(l / 2) as usize) << (8 - 4 * (l % 2)) & 0x700;
                IQ1S_GRID[*qs.add(l) as usize | h]
            });
            let y = loadu(a.add(AQS + 32 * ib));
            let prod = _mm256_sign_epi8(y, grid_bytes(g));
            let s1 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, prod), _mm256_set1_epi16(1));
            let s2 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, y), _mm256_set1_epi16(1));
            let ls = |h: usize| 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * h)) & 7) as i32 + 1;
            let (ls1, ls2) = (ls(0), ls(1));
            let dl = |l: usize| {
                let minus = *qh.add(l / 2) & (0x08 << (4 * (l % 2))) != 0;
                if minus {
                    -1
                } else {
                    1
                }
            };
            let m2 = _mm256_setr_epi32(
                dl(0) * ls1,
                dl(0) * ls1,
                dl(1) * ls1,
                dl(1) * ls1,
                dl(2) * ls2,
                dl(2) * ls2,
                dl(3) * ls2,
                dl(3) * ls2,
            );
            let m1 = _mm256_setr_epi32(ls1, ls1, ls1, ls1, ls2, ls2, ls2, ls2);
            acc1 = _mm256_add_epi32(acc1, _mm256_mullo_epi32(s1, m1));
            acc2 = _mm256_add_epi32(acc2, _mm256_mullo_epi32(s2, m2));
        }
        let (sumi1, sumi2) = (hsum_epi32(acc1), hsum_epi32(acc2));
        d * read_f32(a) * (sumi1 as f32 + IQ1M_DELTA * sumi2 as f32)
    }
}

/// `R` rows × `T` tokens: per block and row the format's terms, added per (row, token) in block order
/// as the scalar reference adds them; `prefetch`: the rows are streamed from memory (decode layout).
///
/// # Safety
/// Each `w[r]` must point to `nb` readable blocks of `K::WB` bytes and each `a[t]` to `nb` Q8_K blocks
/// (`quant_rows` checks the slice lengths); every read stays inside those blocks. The CPU must have the
/// features `S` is compiled for.
#[inline(always)]
unsafe fn iq2_tile<S: Simd, K: Iq2, const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
    prefetch: bool,
) -> [[f32; T]; R] {
    let mut sum = [[0f32; T]; R];
    let mut pf = StreamPrefetch::new(w);
    for b in 0..nb {
        if prefetch {
            pf.upto((b + 1) * K::WB);
        }
        let ab: [*const u8; T] = core::array::from_fn(|t| a[t].add(b * AB));
        for (s, w) in sum.iter_mut().zip(w) {
            let terms = K::terms::<S, T>(w.add(b * K::WB), &ab);
            for (s, v) in s.iter_mut().zip(terms) {
                *s += v;
            }
        }
    }
    sum.map(|row| row.map(|s| K::ROW_SCALE * s))
}

macro_rules! iq2_tile_impl {
    ($($name:ident),*) => {$(
        impl QuantTile for $name {
            const WB: usize = <$name as Iq2>::WB;
            const AB: usize = AB;
            #[inline(always)]
            unsafe fn tile<S: Simd, const R: usize, const T: usize>(
                w: [*const u8; R],
                a: [*const u8; T],
                nb: usize,
            ) -> [[f32; T]; R] {
                iq2_tile::<S, $name, R, T>(w, a, nb, false)
            }
            #[inline(always)]
            unsafe fn stream<S: Simd, const R: usize, const T: usize>(
                w: [*const u8; R],
                a: [*const u8; T],
                nb: usize,
            ) -> [[f32; T]; R] {
                iq2_tile::<S, $name, R, T>(w, a, nb, true)
            }
        }
    )*};
}

iq2_tile_impl!(Iq2Xxs, Iq2Xs, Iq2S, Iq1S, Iq1M);

#[cfg(test)]
mod tests {
    use super::super::avx2::Avx2;
    use super::super::avx512::Avx512;
    use super::*;
    use crate::quant::iq::grids::KSIGNS_IQ2XS;
    use crate::quant::{self, GgmlType};

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_avx2<K: QuantTile>(w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
        super::super::quant_rows::<Avx2, K, 4, 1, 16>(w, a, n_tok, out)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn rows_avx512<K: QuantTile>(w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
        super::super::quant_rows::<Avx512, K, 4, 1, 16>(w, a, n_tok, out)
    }

    /// How the weight bytes are filled (the f16 scale is set separately).
    #[derive(Clone, Copy, Debug)]
    enum Fill {
        Random,
        Bytes(u8),
    }

    /// Blocks filled as `fill` (random finite f16 scales) · random Q8_K rows, every tile shape the
    /// tables run (decode stripes with odd remainders, several tokens, prefill tiles and their edges):
    /// the same f32 bits as the scalar reference, on AVX2 and (where the CPU has it) AVX-512.
    fn bit_identical<K: QuantTile>(ty: GgmlType) {
        if !super::super::avx2::detected() {
            return;
        }
        let wide = super::super::avx512::detected();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let shapes = [
            (1, 1),
            (5, 1),
            (9, 1),
            (17, 1),
            (4, 2),
            (7, 3),
            (3, 4),
            (5, 5),
            (2, 16),
            (3, 19),
        ];
        let fills = [
            Fill::Random,
            Fill::Random,
            Fill::Bytes(0),
            Fill::Bytes(0xFF),
            Fill::Bytes(0x80),
        ];
        for (fi, fill) in fills.into_iter().enumerate() {
            for (rows, n_tok) in shapes {
                let nb = 1 + (rows + n_tok + fi) % 4;
                let n = nb * 256;
                let mut w: Vec<u8> = (0..rows * nb * K::WB)
                    .map(|_| match fill {
                        Fill::Random => rnd() as u8,
                        Fill::Bytes(b) => b,
                    })
                    .collect();
                for b in w.chunks_exact_mut(K::WB) {
                    let d = ((rnd() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
                    let h = quant::f16_from_f32(d);
                    if ty == GgmlType::IQ1_M {
                        // The f16 scale's nibble k is the top nibble of the u16 scale word k.
                        for k in 0..4 {
                            let v = &mut b[48 + 2 * k + 1];
                            *v = (*v & 0x0F) | (((h >> (4 * k)) & 0xF) << 4) as u8;
                        }
                    } else {
                        b[..2].copy_from_slice(&h.to_le_bytes());
                    }
                }
                // Activations over the full Q8_K range (one row with a huge value: quants ±127).
                let x: Vec<f32> = (0..n_tok * n)
                    .map(|i| {
                        let v = (rnd() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                        if i % 97 == 3 {
                            v * 1e3
                        } else {
                            v
                        }
                    })
                    .collect();
                let mut a = vec![0u8; n_tok * nb * AB];
                quant::quantize_row(GgmlType::Q8_K, &x, &mut a).unwrap();
                let (rb, ab) = (nb * K::WB, nb * AB);
                let mut want = vec![0f32; rows * n_tok];
                for r in 0..rows {
                    for t in 0..n_tok {
                        want[r * n_tok + t] =
                            quant::vec_dot_row(ty, &w[r * rb..][..rb], &a[t * ab..][..ab]).unwrap();
                    }
                }
                let mut runs: Vec<(&str, Vec<f32>)> = Vec::new();
                let mut got = vec![f32::NAN; rows * n_tok];
                // SAFETY: AVX2, FMA and F16C were detected above.
                unsafe { rows_avx2::<K>(&w, &a, n_tok, &mut got) };
                runs.push(("avx2", got));
                if wide {
                    let mut got = vec![f32::NAN; rows * n_tok];
                    // SAFETY: the AVX-512 table's features were detected above.
                    unsafe { rows_avx512::<K>(&w, &a, n_tok, &mut got) };
                    runs.push(("avx512", got));
                }
                for (isa, got) in runs {
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{ty} {isa} {fill:?} rows={rows} n_tok={n_tok} r{} t{}: {g} vs {e}",
                            i / n_tok,
                            i % n_tok
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn ksigns_by_parity() {
        if !super::super::avx2::detected() {
            return;
        }
        #[target_feature(enable = "avx2")]
        unsafe fn all() -> [u8; 128] {
            let mut out = [0u8; 128];
            for c in 0..4 {
                let codes = _mm256_add_epi8(
                    _mm256_setr_epi8(
                        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                        21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                    ),
                    _mm256_set1_epi8(32 * c as i8),
                );
                _mm256_storeu_si256(
                    out.as_mut_ptr().add(32 * c) as *mut __m256i,
                    ksigns32(codes),
                );
            }
            out
        }
        // SAFETY: AVX2 was detected above.
        assert_eq!(unsafe { all() }, KSIGNS_IQ2XS);
    }

    #[test]
    fn kernels_equal_scalar_bitwise() {
        bit_identical::<Iq2Xxs>(GgmlType::IQ2_XXS);
        bit_identical::<Iq2Xs>(GgmlType::IQ2_XS);
        bit_identical::<Iq2S>(GgmlType::IQ2_S);
        bit_identical::<Iq1S>(GgmlType::IQ1_S);
        bit_identical::<Iq1M>(GgmlType::IQ1_M);
    }
}
