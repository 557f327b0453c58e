//! The 512-bit form of the Q6_K row sum of the decode kernel (AVX-512 table): two chunks per vector.
//!
//! The 256-bit kernel (`kquants::s16_row_sum`) spends per 32-element chunk a code load, nibble and
//! high-bit extraction, a scale shuffle, `maddubs` and `vpdpwssd`. Here one vector holds chunks `2q` and
//! `2q + 1`: the low (or high) nibbles of 64 consecutive `ql` bytes plus two bit pairs of the same 32 `qh`
//! bytes, their activations are 64 consecutive bytes of the Q8_K block, and each 128-bit lane gets its
//! scale (one per 16 elements) from a table of the row's 16 scale pairs by one `vpermd`. The integer sum
//! is the same exact integer, so results are bit-identical to the 256-bit kernel. Criterion-free probe
//! (`examples/kq_speed`, matrix in L2): 29.6 against 21.5 GB/s.
//!
//! The same scheme for Q4_K/Q5_K measured no faster than their 256-bit kernel (22.9 against 24.8 GB/s for
//! Q4_K): with 512-bit vectors only two ports execute vector µops, and Q4_K's chunk has too little work
//! besides the two multiplies to gain from halving the instruction count.

use core::arch::x86_64::*;

use super::kquants::{offset_start, s16_row_sum, S16Row, AQS, Q6K};
use super::{loadu, loadu128, Simd};

impl S16Row for Q6K {
    #[inline(always)]
    unsafe fn row_sum<S: Simd, const T: usize>(
        p: *const u8,
        ab: &[*const u8; T],
        bs: &[__m256i; T],
    ) -> ([__m256i; T], [__m256i; T]) {
        if !S::WIDE {
            return s16_row_sum::<S, Q6K, T>(p, ab, bs);
        }
        // The 16 i8 scales: widened for the offset correction, and as i16 pairs `s | s << 16`, one per
        // u32 lane, for the products.
        let sc8 = loadu128(p.add(192));
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        let s32 = _mm512_cvtepi8_epi32(sc8);
        let pairs = _mm512_or_si512(
            _mm512_and_si512(s32, _mm512_set1_epi32(0xFFFF)),
            _mm512_slli_epi32::<16>(s32),
        );
        // The 128-bit lane of each u32 lane.
        let lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        let mut v = [_mm512_setzero_si512(); T];
        for h in 0..2 {
            let ql = _mm512_loadu_si512(p.add(64 * h) as *const _);
            let qh = _mm512_broadcast_i64x4(loadu(p.add(128 + 32 * h)));
            for k in 0..2 {
                // Chunks 4h + 2k and 4h + 2k + 1: nibble k of the ql bytes, qh bit pairs 2k and 2k + 1
                // (bits 4k..4k+2 and 4k+2..4k+4) moved to bits 4, 5.
                let l = if k == 0 {
                    ql
                } else {
                    _mm512_srli_epi16::<4>(ql)
                };
                let l = _mm512_and_si512(l, _mm512_set1_epi8(0x0F));
                let lo_mask = _mm256_set1_epi8((3u8 << (4 * k)) as i8);
                let hi_mask = _mm256_set1_epi8((3u8 << (4 * k + 2)) as i8);
                let hb = _mm512_and_si512(
                    qh,
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo_mask), hi_mask),
                );
                let hb = if k == 0 {
                    // bits 0-1 → 4-5 (shift 4), bits 2-3 → 4-5 (shift 2)
                    _mm512_sllv_epi16(
                        hb,
                        _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2)),
                    )
                } else {
                    // bits 4-5 stay, bits 6-7 → 4-5 (shift right 2)
                    _mm512_srlv_epi16(
                        hb,
                        _mm512_inserti64x4::<1>(_mm512_set1_epi16(0), _mm256_set1_epi16(2)),
                    )
                };
                let q = _mm512_or_si512(l, hb);
                let pair = 2 * h + k; // chunks 2·pair, 2·pair + 1
                                      // 128-bit lane i: scale 4·pair + i.
                let at = _mm512_add_epi32(lane, _mm512_set1_epi32(4 * pair as i32));
                let s = _mm512_permutexvar_epi32(at, pairs);
                for (v, ab) in v.iter_mut().zip(ab) {
                    let y = _mm512_loadu_si512(ab.add(AQS + 64 * pair) as *const _);
                    *v = _mm512_dpwssd_epi32(*v, _mm512_maddubs_epi16(q, y), s);
                }
            }
        }
        let sums = core::array::from_fn(|t| {
            let corr = _mm256_madd_epi16(bs[t], sc16);
            let v = _mm256_add_epi32(
                _mm512_castsi512_si256(v[t]),
                _mm512_extracti64x4_epi64::<1>(v[t]),
            );
            _mm256_add_epi32(offset_start::<Q6K>(corr), v)
        });
        (sums, [_mm256_setzero_si256(); T])
    }
}
