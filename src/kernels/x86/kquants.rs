//! The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) × Q8_K.
//!
//! A super-block is handled as 8 chunks of 32 elements. Each chunk yields unsigned codes (u8, small
//! enough that `maddubs` pair sums fit an i16) and a vector of i16 scales (one per 16 elements), so
//! `dot_u8i8_s16` accumulates `Σ scale·q·y` exactly in i32. The rest comes from the activations' block
//! sums: Q2_K/Q4_K/Q5_K subtract `dmin·Σ min·bsum`; Q3_K/Q6_K, whose codes are stored with an offset
//! (4, 32), subtract `offset·Σ scale·bsum` from the integer sum.

use core::arch::x86_64::*;

use super::{f16_at, hsum_ps, loadu, loadu128, read_f32, read_u32, QuantTile, Simd};

/// Q8_K: f32 d, 256 quants, 16 i16 block sums.
const AB: usize = 292;
const AQS: usize = 4;
const ABSUMS: usize = 260;

/// What a weight super-block provides before its chunks are read.
#[derive(Clone, Copy)]
struct Pre {
    d: f32,
    /// `dmin` for the formats with mins (their term is `−dmin·dy·Σ corr·bsums`).
    dmin: f32,
    /// i16 scales 0..7 in both 128-bit lanes.
    sc_lo: __m256i,
    /// i16 scales 8..15 in both lanes (16-sub-block formats).
    sc_hi: __m256i,
    /// 16 i16 factors for the activation block sums.
    corr: __m256i,
}

trait KFormat {
    const WB: usize;
    /// Formats with mins (`dmin`); otherwise `corr·bsums` is shifted left by `SHIFT` and subtracted from
    /// the integer sum.
    const MINS: bool;
    const SHIFT: i32;
    /// 16 scales of 16 elements (else 8 of 32).
    const SCALES16: bool;
    unsafe fn prepare(p: *const u8) -> Pre;
    /// Codes of chunk `c` (elements `32c..32c+32`).
    unsafe fn chunk(p: *const u8, c: usize) -> __m256i;
}

/// The i16 scale vector of chunk `c`.
#[inline(always)]
unsafe fn chunk_scales<K: KFormat>(pre: &Pre, c: usize) -> __m256i {
    if K::SCALES16 {
        // Low lane: scale 2c (elements 0..16 of the chunk), high lane: scale 2c+1.
        let (src, k) = if c < 4 {
            (pre.sc_lo, 2 * c)
        } else {
            (pre.sc_hi, 2 * c - 8)
        };
        let lo = (2 * k) as i8;
        let hi = (2 * k + 2) as i8;
        let ctrl = _mm256_setr_epi8(
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
        );
        _mm256_shuffle_epi8(src, ctrl)
    } else {
        let b = (2 * c) as i16;
        let ctrl = _mm256_set1_epi16(b | ((b + 1) << 8));
        _mm256_shuffle_epi8(pre.sc_lo, ctrl)
    }
}

/// Broadcasts the low / high 8 i16 of `v16` (16 i16 scales) to both lanes.
#[inline(always)]
unsafe fn split_scales(v16: __m256i) -> (__m256i, __m256i) {
    (
        _mm256_permute2x128_si256::<0x00>(v16, v16),
        _mm256_permute2x128_si256::<0x11>(v16, v16),
    )
}

#[inline(always)]
unsafe fn shr16(v: __m256i, n: usize) -> __m256i {
    _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32))
}

/// Q4_K/Q5_K 12-byte scales → 16 bytes `[S0..S7, M0..M7]` (ggml's `kmask` arithmetic).
#[inline(always)]
unsafe fn scale_min_bytes(p: *const u8) -> __m128i {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let (u0, u1, u2) = (read_u32(p), read_u32(p.add(4)), read_u32(p.add(8)));
    let s0 = u0 & K1;
    let s1 = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let m0 = u1 & K1;
    let m1 = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    _mm_setr_epi32(s0 as i32, s1 as i32, m0 as i32, m1 as i32)
}

#[inline(always)]
unsafe fn prepare_scale_min(p: *const u8) -> Pre {
    let sm = scale_min_bytes(p.add(4));
    let sc = _mm_cvtepu8_epi16(sm);
    let sc_lo = _mm256_broadcastsi128_si256(sc);
    // Block sum j (16 elements) belongs to sub-block j/2: min bytes 8,8,9,9,..,15,15.
    let mins = _mm_shuffle_epi8(
        sm,
        _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15),
    );
    Pre {
        d: f16_at(p),
        dmin: f16_at(p.add(2)),
        sc_lo,
        sc_hi: sc_lo,
        corr: _mm256_cvtepu8_epi16(mins),
    }
}

/// Nibbles of chunk `c` of a Q4_K/Q5_K `qs` array.
#[inline(always)]
unsafe fn nibble_chunk(qs: *const u8, c: usize) -> __m256i {
    let v = loadu(qs.add(32 * (c / 2)));
    let v = if c.is_multiple_of(2) {
        v
    } else {
        _mm256_srli_epi16::<4>(v)
    };
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// Two-bit codes of chunk `c` of a Q2_K/Q3_K `qs` array.
#[inline(always)]
unsafe fn crumb_chunk(qs: *const u8, c: usize) -> __m256i {
    let v = loadu(qs.add(32 * (c / 4)));
    _mm256_and_si256(shr16(v, 2 * (c % 4)), _mm256_set1_epi8(3))
}

pub(crate) struct Q4K;
impl KFormat for Q4K {
    const WB: usize = 144;
    const MINS: bool = true;
    const SHIFT: i32 = 0;
    const SCALES16: bool = false;
    #[inline(always)]
    unsafe fn prepare(p: *const u8) -> Pre {
        prepare_scale_min(p)
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, c: usize) -> __m256i {
        nibble_chunk(p.add(16), c)
    }
}

pub(crate) struct Q5K;
impl KFormat for Q5K {
    const WB: usize = 176;
    const MINS: bool = true;
    const SHIFT: i32 = 0;
    const SCALES16: bool = false;
    #[inline(always)]
    unsafe fn prepare(p: *const u8) -> Pre {
        prepare_scale_min(p)
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, c: usize) -> __m256i {
        let hb = _mm256_and_si256(shr16(loadu(p.add(16)), c), _mm256_set1_epi8(1));
        _mm256_or_si256(nibble_chunk(p.add(48), c), _mm256_slli_epi16::<4>(hb))
    }
}

pub(crate) struct Q2K;
impl KFormat for Q2K {
    const WB: usize = 84;
    const MINS: bool = true;
    const SHIFT: i32 = 0;
    const SCALES16: bool = true;
    #[inline(always)]
    unsafe fn prepare(p: *const u8) -> Pre {
        let b = loadu128(p);
        let m = _mm_set1_epi8(0x0F);
        let sc = _mm256_cvtepu8_epi16(_mm_and_si128(b, m));
        let (sc_lo, sc_hi) = split_scales(sc);
        Pre {
            d: f16_at(p.add(80)),
            dmin: f16_at(p.add(82)),
            sc_lo,
            sc_hi,
            corr: _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(b), m)),
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, c: usize) -> __m256i {
        crumb_chunk(p.add(16), c)
    }
}

pub(crate) struct Q3K;
impl KFormat for Q3K {
    const WB: usize = 110;
    const MINS: bool = false;
    const SHIFT: i32 = 2;
    const SCALES16: bool = true;
    #[inline(always)]
    unsafe fn prepare(p: *const u8) -> Pre {
        const K1: u32 = 0x0303_0303;
        const K2: u32 = 0x0f0f_0f0f;
        let s = p.add(96);
        let (a0, a1, a2) = (read_u32(s), read_u32(s.add(4)), read_u32(s.add(8)));
        let s0 = (a0 & K2) | ((a2 & K1) << 4);
        let s1 = (a1 & K2) | (((a2 >> 2) & K1) << 4);
        let s2 = ((a0 >> 4) & K2) | (((a2 >> 4) & K1) << 4);
        let s3 = ((a1 >> 4) & K2) | (((a2 >> 6) & K1) << 4);
        let u = _mm_setr_epi32(s0 as i32, s1 as i32, s2 as i32, s3 as i32);
        let sc = _mm256_cvtepi8_epi16(_mm_sub_epi8(u, _mm_set1_epi8(32)));
        let (sc_lo, sc_hi) = split_scales(sc);
        Pre {
            d: f16_at(p.add(108)),
            dmin: 0.0,
            sc_lo,
            sc_hi,
            corr: sc,
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, c: usize) -> __m256i {
        let hb = _mm256_and_si256(shr16(loadu(p), c), _mm256_set1_epi8(1));
        _mm256_or_si256(crumb_chunk(p.add(32), c), _mm256_slli_epi16::<2>(hb))
    }
}

pub(crate) struct Q6K;
impl KFormat for Q6K {
    const WB: usize = 210;
    const MINS: bool = false;
    const SHIFT: i32 = 5;
    const SCALES16: bool = true;
    #[inline(always)]
    unsafe fn prepare(p: *const u8) -> Pre {
        let sc = _mm256_cvtepi8_epi16(loadu128(p.add(192)));
        let (sc_lo, sc_hi) = split_scales(sc);
        Pre {
            d: f16_at(p.add(208)),
            dmin: 0.0,
            sc_lo,
            sc_hi,
            corr: sc,
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, c: usize) -> __m256i {
        let (h, j) = (c / 4, c % 4);
        let l = loadu(p.add(64 * h + 32 * (j % 2)));
        let l = if j < 2 { l } else { _mm256_srli_epi16::<4>(l) };
        let l = _mm256_and_si256(l, _mm256_set1_epi8(0x0F));
        let hb = _mm256_and_si256(
            shr16(loadu(p.add(128 + 32 * h)), 2 * j),
            _mm256_set1_epi8(3),
        );
        _mm256_or_si256(l, _mm256_slli_epi16::<4>(hb))
    }
}

macro_rules! ktile {
    ($($t:ident),*) => {$(
        impl QuantTile for $t {
            const WB: usize = <$t as KFormat>::WB;
            const AB: usize = AB;
            #[inline(always)]
            unsafe fn tile<S: Simd, const R: usize, const T: usize>(
                w: [*const u8; R],
                a: [*const u8; T],
                nb: usize,
            ) -> [[f32; T]; R] {
                k_tile::<S, $t, R, T>(w, a, nb)
            }
        }
    )*};
}
ktile!(Q2K, Q3K, Q4K, Q5K, Q6K);

#[inline(always)]
unsafe fn k_tile<S: Simd, K: KFormat, const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for b in 0..nb {
        let mut wb = [core::ptr::null::<u8>(); R];
        let mut pre = [Pre {
            d: 0.0,
            dmin: 0.0,
            sc_lo: zero,
            sc_hi: zero,
            corr: zero,
        }; R];
        for r in 0..R {
            wb[r] = w[r].add(b * K::WB);
            pre[r] = K::prepare(wb[r]);
        }
        let mut ab = [core::ptr::null::<u8>(); T];
        for t in 0..T {
            ab[t] = a[t].add(b * AB);
        }
        let mut isum = [[zero; T]; R];
        for c in 0..8 {
            let mut q = [zero; R];
            let mut s = [zero; R];
            for r in 0..R {
                q[r] = K::chunk(wb[r], c);
                s[r] = chunk_scales::<K>(&pre[r], c);
            }
            for t in 0..T {
                let y = loadu(ab[t].add(AQS + 32 * c));
                for r in 0..R {
                    isum[r][t] = S::dot_u8i8_s16(isum[r][t], q[r], y, s[r]);
                }
            }
        }
        for t in 0..T {
            let dy = read_f32(ab[t]);
            let bsums = loadu(ab[t].add(ABSUMS));
            for r in 0..R {
                let corr = _mm256_madd_epi16(bsums, pre[r].corr);
                if K::MINS {
                    acc[r][t] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(isum[r][t]),
                        _mm256_set1_ps(pre[r].d * dy),
                        acc[r][t],
                    );
                    acc[r][t] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(corr),
                        _mm256_set1_ps(-(pre[r].dmin * dy)),
                        acc[r][t],
                    );
                } else {
                    let i = _mm256_sub_epi32(
                        isum[r][t],
                        _mm256_sll_epi32(corr, _mm_cvtsi32_si128(K::SHIFT)),
                    );
                    acc[r][t] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(i),
                        _mm256_set1_ps(pre[r].d * dy),
                        acc[r][t],
                    );
                }
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum_ps(acc[r][t]);
        }
    }
    out
}
