//! The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) × Q8_K.
//!
//! A super-block is handled as 8 chunks of 32 elements. Each chunk yields unsigned codes (u8, small
//! enough that `maddubs` pair sums fit an i16) and a vector of i16 scales (one per 16 elements), so
//! `dot_u8i8_s16` accumulates `Σ scale·q·y` exactly in i32. The rest comes from the activations' block
//! sums: Q2_K/Q4_K/Q5_K subtract `dmin·Σ min·bsum`; Q3_K/Q6_K, whose codes are stored with an offset
//! (4, 32), subtract `offset·Σ scale·bsum` from the integer sum.

use core::arch::x86_64::*;

use super::{f16_at, loadu, loadu128, read_f32, read_u32, QuantTile, Simd, StreamPrefetch};

/// Q8_K: f32 d, 256 quants, 16 i16 block sums.
pub(super) const AB: usize = 292;
pub(super) const AQS: usize = 4;
pub(super) const ABSUMS: usize = 260;

/// What a weight super-block provides before its chunks are read.
#[derive(Clone, Copy)]
pub(super) struct Pre {
    pub(super) d: f32,
    /// `dmin` for the formats with mins (their term is `−dmin·dy·Σ corr·bsums`).
    pub(super) dmin: f32,
    /// i16 scales 0..7 in both 128-bit lanes.
    pub(super) sc_lo: __m256i,
    /// i16 scales 8..15 in both lanes (16-sub-block formats).
    pub(super) sc_hi: __m256i,
    /// 16 i16 factors for the activation block sums.
    pub(super) corr: __m256i,
}

pub(super) trait KFormat {
    const WB: usize;
    /// Formats with mins (`dmin`); otherwise `corr·bsums` is shifted left by `SHIFT` and subtracted from
    /// the integer sum.
    const MINS: bool;
    const SHIFT: i32;
    /// 16 scales of 16 elements (else 8 of 32).
    const SCALES16: bool;
    /// Bits per code (codes are `0..2^CODE_BITS`).
    const CODE_BITS: u32;
    /// Offset of a u32 inside the block holding `d` as its low (`D_HI == 0`) or high half; for formats
    /// with mins, `dmin` is the high half.
    const DD_AT: usize = 0;
    /// Has a 16-row decode tile on AVX-512 (`kdecode16`).
    const DECODE16: bool = false;
    const D_HI: i32 = 0;
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
    const DECODE16: bool = true;
    const CODE_BITS: u32 = 4;
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
    const CODE_BITS: u32 = 5;
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
    const CODE_BITS: u32 = 2;
    const DD_AT: usize = 80;
    const D_HI: i32 = 0;
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
    const CODE_BITS: u32 = 3;
    const DD_AT: usize = 106;
    const D_HI: i32 = 1;
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
    const CODE_BITS: u32 = 6;
    const DD_AT: usize = 206;
    const D_HI: i32 = 1;
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
        // Bits 2j, 2j+1 of qh moved to bits 4, 5: mask first, then one shift (none for j = 2).
        let qh = loadu(p.add(128 + 32 * h));
        let hb = _mm256_and_si256(qh, _mm256_set1_epi8((3u8 << (2 * j)) as i8));
        let hb = match j {
            0 => _mm256_slli_epi16::<4>(hb),
            1 => _mm256_slli_epi16::<2>(hb),
            2 => hb,
            _ => _mm256_srli_epi16::<2>(hb),
        };
        _mm256_or_si256(l, hb)
    }
}

/// `QuantTile` for each format: decode (4 rows × 1 token) through its dedicated kernel, the other tile
/// shapes through [`k_tile`]; the decode layout's tiles (4 rows × up to `FEW_TOKENS` tokens) through the
/// decode kernel.
macro_rules! ktile {
    ($($t:ident => $decode4:ident),*) => {$(
        impl QuantTile for $t {
            const WB: usize = <$t as KFormat>::WB;
            const AB: usize = AB;
            #[inline(always)]
            unsafe fn tile<S: Simd, const R: usize, const T: usize>(
                w: [*const u8; R],
                a: [*const u8; T],
                nb: usize,
            ) -> [[f32; T]; R] {
                if R == 4 && T == 1 {
                    return Self::stream::<S, R, T>(w, a, nb);
                }
                k_tile::<S, $t, R, T>(w, a, nb)
            }
            #[inline(always)]
            unsafe fn stream<S: Simd, const R: usize, const T: usize>(
                w: [*const u8; R],
                a: [*const u8; T],
                nb: usize,
            ) -> [[f32; T]; R] {
                if R == 4 {
                    let r = $decode4::<S, $t, T>(core::array::from_fn(|i| w[i]), a, nb);
                    return core::array::from_fn(|i| r[i]);
                }
                if R == super::kdecode16::ROWS && S::WIDE && <$t as KFormat>::DECODE16 {
                    let r = super::kdecode16::decode16_q4k::<T>(core::array::from_fn(|i| w[i]), a, nb);
                    return core::array::from_fn(|i| r[i]);
                }
                k_tile::<S, $t, R, T>(w, a, nb)
            }
        }
    )*};
}
ktile!(
    Q2K => decode4_s16,
    Q3K => decode4_s16,
    Q4K => decode4_sm8,
    Q5K => decode4_sm8,
    Q6K => decode4_s16
);

#[inline(always)]
unsafe fn k_tile<S: Simd, K: KFormat, const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let zero = _mm256_setzero_si256();
    let mut acc = [[0f32; T]; R];
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
        // Per (row, token): the block's integer sum S (and mins sum M) folded to one i32, then
        // acc = fma(S, d·dy, acc) [acc = fma(M, −dmin·dy, acc)]: the same float operations, in the same
        // order, as the decode kernels, so that prefill and decode give bit-identical results.
        let mut dy = [0f32; T];
        let mut sv = [[zero; T]; R];
        let mut mv = [[zero; T]; R];
        for t in 0..T {
            dy[t] = read_f32(ab[t]);
            let bsums = loadu(ab[t].add(ABSUMS));
            for r in 0..R {
                let corr = _mm256_madd_epi16(bsums, pre[r].corr);
                if K::MINS {
                    sv[r][t] = isum[r][t];
                    mv[r][t] = corr;
                } else {
                    sv[r][t] = _mm256_sub_epi32(
                        isum[r][t],
                        _mm256_sll_epi32(corr, _mm_cvtsi32_si128(K::SHIFT)),
                    );
                }
            }
        }
        for r in 0..R {
            if T == 4 {
                let dyv = _mm_loadu_ps(dy.as_ptr());
                let a = _mm_loadu_ps(acc[r].as_ptr());
                let sf = _mm_cvtepi32_ps(fold4(core::array::from_fn(|t| sv[r][t])));
                let mut a = _mm_fmadd_ps(sf, _mm_mul_ps(_mm_set1_ps(pre[r].d), dyv), a);
                if K::MINS {
                    let mf = _mm_cvtepi32_ps(fold4(core::array::from_fn(|t| mv[r][t])));
                    a = _mm_fnmadd_ps(mf, _mm_mul_ps(_mm_set1_ps(pre[r].dmin), dyv), a);
                }
                _mm_storeu_ps(acc[r].as_mut_ptr(), a);
            } else if T == 8 {
                // The same per-token operations as below, eight tokens per vector: the eight sums are
                // folded together (one transpose-add) instead of one horizontal sum each.
                let dyv = _mm256_loadu_ps(dy.as_ptr());
                let a = _mm256_loadu_ps(acc[r].as_ptr());
                let sf = _mm256_cvtepi32_ps(fold8(core::array::from_fn(|t| sv[r][t])));
                let mut a = _mm256_fmadd_ps(sf, _mm256_mul_ps(_mm256_set1_ps(pre[r].d), dyv), a);
                if K::MINS {
                    let mf = _mm256_cvtepi32_ps(fold8(core::array::from_fn(|t| mv[r][t])));
                    a = _mm256_fnmadd_ps(mf, _mm256_mul_ps(_mm256_set1_ps(pre[r].dmin), dyv), a);
                }
                _mm256_storeu_ps(acc[r].as_mut_ptr(), a);
            } else {
                for t in 0..T {
                    let sf = hsum_epi32(sv[r][t]) as f32;
                    acc[r][t] = sf.mul_add(pre[r].d * dy[t], acc[r][t]);
                    if K::MINS {
                        let mf = hsum_epi32(mv[r][t]) as f32;
                        acc[r][t] = mf.mul_add(-(pre[r].dmin * dy[t]), acc[r][t]);
                    }
                }
            }
        }
    }
    acc
}

/// Sum of the 8 i32 lanes.
#[inline(always)]
pub(super) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The lane sums of four vectors: `[Σ v0, Σ v1, Σ v2, Σ v3]`.
#[inline(always)]
pub(super) unsafe fn fold4(v: [__m256i; 4]) -> __m128i {
    let s = rows4_sum(v);
    _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s))
}

/// The lane sums of eight vectors: `[Σ v0, Σ v1, …, Σ v7]`.
#[inline(always)]
unsafe fn fold8(v: [__m256i; 8]) -> __m256i {
    let s0 = rows4_sum([v[0], v[1], v[2], v[3]]);
    let s1 = rows4_sum([v[4], v[5], v[6], v[7]]);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(s0, s1),
        _mm256_permute2x128_si256::<0x31>(s0, s1),
    )
}

/// `vpbroadcastd` of the i16 scale pair of chunk `C` from a row's scale table (see [`decode4_sm8`]): a
/// pure load (no shuffle µop; the compiler would otherwise turn it back into a register shuffle of the
/// value it just stored), at a constant offset from `t`.
///
/// # Safety
/// `t` must point into a table with at least `(C / 4) * 8 + C % 4 + 1` readable u32; the CPU must have
/// AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bcast_scale<const C: usize>(t: *const u32) -> __m256i {
    let r: __m256i;
    // SAFETY: the caller guarantees the 4 bytes at `t + 4·((C/4)·8 + C%4)` are readable; the
    // instruction reads only those and writes only the output register.
    unsafe {
        core::arch::asm!(
            "vpbroadcastd {r}, dword ptr [{t} + {o}]",
            t = in(reg) t,
            o = const ((C / 4) * 8 + C % 4) * 4,
            r = lateout(ymm_reg) r,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    r
}

/// `isum[t] + Σ scale·q·y[t]` over chunk `C` of a Q4_K/Q5_K row, for each token's activation block
/// `ab[t]` (the codes and scales made once).
#[inline(always)]
unsafe fn sm8_chunk<S: Simd, K: KFormat, const C: usize, const T: usize>(
    isum: &mut [__m256i; T],
    p: *const u8,
    ab: &[*const u8; T],
    t: *const u32,
) {
    let (q, s) = (K::chunk(p, C), bcast_scale::<C>(t));
    for (v, ab) in isum.iter_mut().zip(ab) {
        *v = S::dot_u8i8_s16(*v, q, loadu(ab.add(AQS + 32 * C)), s);
    }
}

/// [`sm8_chunk`] for four rows: `isum[r][t] + Σ scale·q·y[t]` over chunk `C` of each row `p[r]`.
#[inline(always)]
unsafe fn sm8_chunk_rows<S: Simd, K: KFormat, const C: usize, const T: usize>(
    isum: &mut [[__m256i; T]; 4],
    p: &[*const u8; 4],
    ab: &[*const u8; T],
    tp: &[*const u32; 4],
) {
    let y: [__m256i; T] = core::array::from_fn(|t| loadu(ab[t].add(AQS + 32 * C)));
    for (isum, (&p, &tp)) in isum.iter_mut().zip(p.iter().zip(tp)) {
        let (q, s) = (K::chunk(p, C), bcast_scale::<C>(tp));
        for (v, &y) in isum.iter_mut().zip(&y) {
            *v = S::dot_u8i8_s16(*v, q, y, s);
        }
    }
}

/// Two 16-byte loads into the two 128-bit lanes.
#[inline(always)]
unsafe fn load2(lo: *const u8, hi: *const u8) -> __m256i {
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(loadu128(lo)), loadu128(hi))
}

/// Per 128-bit lane, the first 16 bytes of a Q4_K/Q5_K block (`d`, `dmin`, 12 scale bytes) → the bytes
/// `[S0..S7, M0..M7]` (ggml's `kmask` arithmetic, on u32 lanes `[dd, u0, u1, u2]`).
#[inline(always)]
unsafe fn scale_min_bytes2(v: __m256i) -> __m256i {
    // [u0, u1, ..] & 0x3f → [s0 (scales 0-3), m0 (mins 0-3)]
    let a = _mm256_and_si256(
        _mm256_shuffle_epi32::<0b00_00_10_01>(v),
        _mm256_set1_epi32(0x3f3f_3f3f),
    );
    // [u2, u2 >> 4, u0 >> 2, u1 >> 2] masked: low nibbles and the two high bits of scales/mins 4-7.
    let t = _mm256_srlv_epi32(
        _mm256_shuffle_epi32::<0b10_01_11_11>(v),
        _mm256_setr_epi32(0, 4, 2, 2, 0, 4, 2, 2),
    );
    let (k2, k3) = (0x0f0f_0f0f, 0x3030_3030);
    let t = _mm256_and_si256(t, _mm256_setr_epi32(k2, k2, k3, k3, k2, k2, k3, k3));
    let b = _mm256_or_si256(t, _mm256_shuffle_epi32::<0b00_00_11_10>(t));
    _mm256_unpacklo_epi32(a, b)
}

/// `T` tokens × four Q4_K/Q5_K rows, returned as `[row][token]`. Per block: the four rows' `d`/`dmin`
/// are converted together; the scales of two rows at a time are unpacked in one register and stored as
/// i16 pairs, which the chunk loop broadcasts from memory (a load, not a shuffle); each chunk's codes are
/// made once and multiplied with every token's activations; per token, the mins meet the activation
/// block sums (summed per 32) in one `madd` per two rows, and the four rows' integer sums are added
/// pairwise into one vector before a single conversion to float. A token's float operations are the
/// same whatever `T` is, so every token's result is bit-identical to a one-token call's.
///
/// # Safety
/// Each `w[r]` must point to `nb` readable blocks of `K::WB` bytes and each `a[t]` to `nb` Q8_K blocks
/// (`quant_rows` checks the slice lengths); every load below stays inside those blocks (the 16-byte
/// loads at a block's start read `d`, `dmin` and the 12 scale bytes, within its first 16 bytes). The CPU
/// must have AVX2, FMA and F16C.
#[inline(always)]
unsafe fn decode4_sm8<S: Simd, K: KFormat, const T: usize>(
    w: [*const u8; 4],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; 4] {
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm_setzero_ps(); T];
    // Per pair of rows: i16 scale pairs of chunks 0-3 (row 2i low lane, 2i+1 high lane), then 4-7.
    let mut tab = [[zero; 2]; 2];
    let mut pf = StreamPrefetch::new(w);
    for b in 0..nb {
        pf.upto((b + 1) * K::WB);
        let p: [*const u8; 4] = core::array::from_fn(|r| w[r].add(b * K::WB));
        let ab: [*const u8; T] = core::array::from_fn(|t| a[t].add(b * AB));
        let v = [load2(p[0], p[1]), load2(p[2], p[3])];
        // [dd0, dd1, dd2, dd3] (f16 pairs d | dmin << 16) → [d0, m0, d1, m1, d2, m2, d3, m3].
        let dd = _mm256_permutevar8x32_epi32(
            _mm256_unpacklo_epi32(v[0], v[1]),
            _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5),
        );
        let dd = _mm256_cvtph_ps(_mm256_castsi256_si128(dd));
        let mut mn16 = [zero; 2];
        for i in 0..2 {
            let sm = scale_min_bytes2(v[i]);
            let sc16 = _mm256_unpacklo_epi8(sm, zero);
            mn16[i] = _mm256_unpackhi_epi8(sm, zero);
            tab[i][0] = _mm256_unpacklo_epi16(sc16, sc16);
            tab[i][1] = _mm256_unpackhi_epi16(sc16, sc16);
        }
        // Row r's scale pairs: u32 0-3 (chunks 0-3) and 8-11 (chunks 4-7) from `tp[r]`.
        let tp: [*const u32; 4] =
            core::array::from_fn(|r| (tab[r / 2].as_ptr() as *const u32).add((r % 2) * 4));
        let mut isum = [[zero; T]; 4];
        if T == 1 {
            for (isum, (&p, &t)) in isum.iter_mut().zip(p.iter().zip(&tp)) {
                sm8_chunk::<S, K, 0, T>(isum, p, &ab, t);
                sm8_chunk::<S, K, 1, T>(isum, p, &ab, t);
                sm8_chunk::<S, K, 2, T>(isum, p, &ab, t);
                sm8_chunk::<S, K, 3, T>(isum, p, &ab, t);
                sm8_chunk::<S, K, 4, T>(isum, p, &ab, t);
                sm8_chunk::<S, K, 5, T>(isum, p, &ab, t);
                sm8_chunk::<S, K, 6, T>(isum, p, &ab, t);
                sm8_chunk::<S, K, 7, T>(isum, p, &ab, t);
            }
        } else {
            // Several tokens: chunk by chunk, each token's activations loaded once for the four rows,
            // the 4·T sums held in registers (row by row, the compiler hoists all 8·T activation
            // vectors out of the row loop and spills them). Two chunks per 512-bit vector on AVX-512
            // measured no faster (hot Q4_K, 2 / 4 tokens: 70.4 / 105 against 63.2 / 107 µs): only two
            // ports execute 512-bit µops.
            sm8_chunk_rows::<S, K, 0, T>(&mut isum, &p, &ab, &tp);
            sm8_chunk_rows::<S, K, 1, T>(&mut isum, &p, &ab, &tp);
            sm8_chunk_rows::<S, K, 2, T>(&mut isum, &p, &ab, &tp);
            sm8_chunk_rows::<S, K, 3, T>(&mut isum, &p, &ab, &tp);
            sm8_chunk_rows::<S, K, 4, T>(&mut isum, &p, &ab, &tp);
            sm8_chunk_rows::<S, K, 5, T>(&mut isum, &p, &ab, &tp);
            sm8_chunk_rows::<S, K, 6, T>(&mut isum, &p, &ab, &tp);
            sm8_chunk_rows::<S, K, 7, T>(&mut isum, &p, &ab, &tp);
        }
        for (t, acc) in acc.iter_mut().enumerate() {
            // [d0, m0, ..] · dy
            let f = _mm256_mul_ps(dd, _mm256_set1_ps(read_f32(ab[t])));
            let bs = loadu(ab[t].add(ABSUMS));
            let q8s = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            );
            let q8s = _mm256_broadcastsi128_si256(q8s);
            // Σ min·bsum per row: [r0 ×4 | r1 ×4], [r2 ×4 | r3 ×4] → [r0, r1, r2, r3].
            let h = _mm256_hadd_epi32(
                _mm256_madd_epi16(mn16[0], q8s),
                _mm256_madd_epi16(mn16[1], q8s),
            );
            let h = _mm256_add_epi32(h, _mm256_shuffle_epi32::<0b10_11_00_01>(h));
            let m4 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
                h,
                _mm256_setr_epi32(0, 4, 2, 6, 0, 4, 2, 6),
            ));
            let s = rows4_sum(core::array::from_fn(|r| isum[r][t]));
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let d4 = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(
                f,
                _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6),
            ));
            let dm4 = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(
                f,
                _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7),
            ));
            *acc = _mm_fmadd_ps(_mm_cvtepi32_ps(s4), d4, *acc);
            *acc = _mm_fnmadd_ps(_mm_cvtepi32_ps(m4), dm4, *acc);
        }
    }
    rows_of(acc)
}

/// Per-token vectors of four rows' results → `[row][token]`.
#[inline(always)]
unsafe fn rows_of<const T: usize>(acc: [__m128; T]) -> [[f32; T]; 4] {
    let mut by_token = [[0f32; 4]; T];
    for (o, v) in by_token.iter_mut().zip(acc) {
        _mm_storeu_ps(o.as_mut_ptr(), v);
    }
    core::array::from_fn(|r| core::array::from_fn(|t| by_token[t][r]))
}

/// Adds the 8 lanes of each of four rows' vectors pairwise: `[r0, r1, r2, r3]` in each 128-bit lane (the
/// two lanes' sums add to the rows' totals).
#[inline(always)]
unsafe fn rows4_sum(v: [__m256i; 4]) -> __m256i {
    let s01 = _mm256_add_epi32(
        _mm256_unpacklo_epi32(v[0], v[1]),
        _mm256_unpackhi_epi32(v[0], v[1]),
    );
    let s23 = _mm256_add_epi32(
        _mm256_unpacklo_epi32(v[2], v[3]),
        _mm256_unpackhi_epi32(v[2], v[3]),
    );
    _mm256_add_epi32(
        _mm256_unpacklo_epi64(s01, s23),
        _mm256_unpackhi_epi64(s01, s23),
    )
}

/// `isum[t] + Σ scale·q·y[t]` over chunk `C` of a 16-scale row, for each token's activation block
/// `ab[t]` (the codes and scales made once).
#[inline(always)]
unsafe fn s16_chunk<S: Simd, K: KFormat, const C: usize, const T: usize>(
    isum: &mut [__m256i; T],
    p: *const u8,
    ab: &[*const u8; T],
    pre: &Pre,
) {
    let (q, s) = (K::chunk(p, C), chunk_scales::<K>(pre, C));
    for (v, ab) in isum.iter_mut().zip(ab) {
        *v = S::dot_u8i8_s16(*v, q, loadu(ab.add(AQS + 32 * C)), s);
    }
}

/// How a 16-scale format's decode kernel ([`decode4_s16`]) sums one row's block.
pub(super) trait S16Row: KFormat + Sized {
    /// Per token `t`, the row's `Σ scale·q·y` with the offset correction (Q3_K/Q6_K:
    /// `−offset·Σ scale·bsum`) as the lanes of a vector, and (Q2_K) its mins term `Σ min·bsum` kept
    /// apart; `ab[t]` is the token's activation block and `bs[t]` its 16 block sums. The row's codes are
    /// unpacked once for all tokens. Q6_K has a 512-bit form (`kquants512`).
    ///
    /// # Safety
    /// `p` must point to a readable block and each `ab[t]` to a Q8_K block; the CPU must have the
    /// features of `S`.
    #[inline(always)]
    unsafe fn row_sum<S: Simd, const T: usize>(
        p: *const u8,
        ab: &[*const u8; T],
        bs: &[__m256i; T],
    ) -> ([__m256i; T], [__m256i; T]) {
        s16_row_sum::<S, Self, T>(p, ab, bs)
    }
}

impl S16Row for Q2K {}
impl S16Row for Q3K {}

/// [`S16Row::row_sum`] on 256-bit vectors: the row's scale vectors made once, then 8 chunks.
#[inline(always)]
pub(super) unsafe fn s16_row_sum<S: Simd, K: KFormat, const T: usize>(
    p: *const u8,
    ab: &[*const u8; T],
    bs: &[__m256i; T],
) -> ([__m256i; T], [__m256i; T]) {
    let zero = _mm256_setzero_si256();
    let pre = K::prepare(p);
    let corr: [__m256i; T] = core::array::from_fn(|t| _mm256_madd_epi16(bs[t], pre.corr));
    let (mut v, mins) = if K::MINS {
        ([zero; T], corr)
    } else {
        (corr.map(|c| offset_start::<K>(c)), [zero; T])
    };
    s16_chunk::<S, K, 0, T>(&mut v, p, ab, &pre);
    s16_chunk::<S, K, 1, T>(&mut v, p, ab, &pre);
    s16_chunk::<S, K, 2, T>(&mut v, p, ab, &pre);
    s16_chunk::<S, K, 3, T>(&mut v, p, ab, &pre);
    s16_chunk::<S, K, 4, T>(&mut v, p, ab, &pre);
    s16_chunk::<S, K, 5, T>(&mut v, p, ab, &pre);
    s16_chunk::<S, K, 6, T>(&mut v, p, ab, &pre);
    s16_chunk::<S, K, 7, T>(&mut v, p, ab, &pre);
    (v, mins)
}

/// `−corr << SHIFT`: where the row sum of a format whose codes carry an offset starts.
#[inline(always)]
pub(super) unsafe fn offset_start<K: KFormat>(corr: __m256i) -> __m256i {
    _mm256_sub_epi32(
        _mm256_setzero_si256(),
        _mm256_sll_epi32(corr, _mm_cvtsi32_si128(K::SHIFT)),
    )
}

/// `T` tokens × four Q2_K/Q3_K/Q6_K rows, returned as `[row][token]`. Per block: the four `d` (and
/// `dmin`) are converted together; each row's scale vectors and codes are made once for all tokens and
/// its offset correction (`offset·Σ scale·bsum`, Q3_K/Q6_K) starts each token's integer sum, or its mins
/// term (Q2_K) is kept as integers; per token, the four rows' sums are added pairwise into one vector
/// before a single conversion to float. A token's float operations are the same whatever `T` is.
///
/// # Safety
/// As [`decode4_sm8`]; the u32 read at `K::DD_AT` ends at or before the block's end (Q6_K: bytes
/// 206..210 of 210, Q3_K: 106..110 of 110, Q2_K: 80..84 of 84).
#[inline(always)]
unsafe fn decode4_s16<S: Simd, K: S16Row, const T: usize>(
    w: [*const u8; 4],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; 4] {
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm_setzero_ps(); T];
    let dh = K::D_HI;
    let d_idx = _mm256_setr_epi32(dh, 2 + dh, 4 + dh, 6 + dh, dh, 2 + dh, 4 + dh, 6 + dh);
    let mut pf = StreamPrefetch::new(w);
    for b in 0..nb {
        pf.upto((b + 1) * K::WB);
        let p: [*const u8; 4] = core::array::from_fn(|r| w[r].add(b * K::WB));
        let ab: [*const u8; T] = core::array::from_fn(|t| a[t].add(b * AB));
        let dd = _mm_setr_epi32(
            read_u32(p[0].add(K::DD_AT)) as i32,
            read_u32(p[1].add(K::DD_AT)) as i32,
            read_u32(p[2].add(K::DD_AT)) as i32,
            read_u32(p[3].add(K::DD_AT)) as i32,
        );
        let dd = _mm256_cvtph_ps(dd);
        let bs: [__m256i; T] = core::array::from_fn(|t| loadu(ab[t].add(ABSUMS)));
        let mut isum = [[zero; T]; 4];
        let mut mins = [[zero; T]; 4];
        for r in 0..4 {
            (isum[r], mins[r]) = K::row_sum::<S, T>(p[r], &ab, &bs);
        }
        for (t, acc) in acc.iter_mut().enumerate() {
            let f = _mm256_mul_ps(dd, _mm256_set1_ps(read_f32(ab[t])));
            let dv = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(f, d_idx));
            let s = fold4(core::array::from_fn(|r| isum[r][t]));
            *acc = _mm_fmadd_ps(_mm_cvtepi32_ps(s), dv, *acc);
            if K::MINS {
                let mv = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(
                    f,
                    _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7),
                ));
                let m = fold4(core::array::from_fn(|r| mins[r][t]));
                *acc = _mm_fnmadd_ps(_mm_cvtepi32_ps(m), mv, *acc);
            }
        }
    }
    rows_of(acc)
}
