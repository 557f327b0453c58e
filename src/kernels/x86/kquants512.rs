//! The 512-bit form of the Q6_K row sum of the decode kernel (AVX-512 table): two chunks per vector.
//!
//! The 256-bit kernel (`kquants::s16_row_sum`) spends per 32-element chunk a code load, nibble and
//! high-bit extraction, a scale shuffle, `maddubs` and `vpdpwssd`. Here one vector holds chunks `2q` and
//! `2q + 1`: the low (or high) nibbles of 64 consecutive `ql` bytes plus two bit pairs of the same 32 `qh`
//! bytes, whose activations are 64 consecutive bytes of the Q8_K block. Per token, each such vector takes
//! one `vpdpbusd` (sums of 4 products, below 2^15), two of them are packed to i16 (`vpackssdw`, exact)
//! and one `vpdpwssd` multiplies each sum by its 16-element group's scale: 1.5 multiplies per 64 codes
//! instead of `maddubs` + `vpdpwssd`'s 2, which is what a few-token tile is bound by on Zen 4 (one
//! integer multiply per cycle). The integer sum is the same exact integer, so results are bit-identical
//! to the 256-bit kernel. `examples/kq_speed` (matrix in L2, one thread, Zen 4): 3 tokens 16.1 → 17.0
//! GB/s; from memory, `examples/few_tokens Q6_K 12288 4096` (2 threads) 3 tokens 1.23–1.25× → 1.09–1.13×
//! one token.
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
        let mut v = [[_mm512_setzero_si512(); T]; 2];
        for h in 0..2 {
            let ql = _mm512_loadu_si512(p.add(64 * h) as *const _);
            let qh = _mm512_broadcast_i64x4(loadu(p.add(128 + 32 * h)));
            // Chunk pairs 2h (k = 0) and 2h + 1 (k = 1): nibble k of the ql bytes, qh bit pairs 2k and
            // 2k + 1 (bits 4k..4k+2 and 4k+2..4k+4) moved to bits 4, 5.
            let code = |k: usize| {
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
                _mm512_or_si512(l, hb)
            };
            let (q0, q1) = (code(0), code(1));
            // After the pack below, 128-bit lane i holds 4 sums of chunk pair 2h (its scale 8h + i) then
            // 4 of pair 2h + 1 (scale 8h + 4 + i), as i16: each u32 lane gets its group's scale pair.
            let at = _mm512_add_epi32(
                _mm512_set_epi32(7, 7, 3, 3, 6, 6, 2, 2, 5, 5, 1, 1, 4, 4, 0, 0),
                _mm512_set1_epi32(8 * h as i32),
            );
            let s = permd(at, pairs);
            for (v, ab) in v[h].iter_mut().zip(ab) {
                let y = ab.add(AQS + 128 * h);
                // Σ₄ q·y per u32 lane: at most 4·63·128 < 2^15, so the signed pack to i16 is exact.
                let a = dpbusd_fresh(q0, y);
                let b = dpbusd_fresh(q1, y.add(64));
                *v = super::kgemm::dpwssd(*v, _mm512_packs_epi32(a, b), s);
            }
        }
        let sums = core::array::from_fn(|t| {
            let corr = _mm256_madd_epi16(bs[t], sc16);
            let v = _mm512_add_epi32(v[0][t], v[1][t]);
            let v = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
            _mm256_add_epi32(offset_start::<Q6K>(corr), v)
        });
        (sums, [_mm256_setzero_si256(); T])
    }
}

/// `_mm512_permutexvar_epi32`, kept a `vpermd`: LLVM folds the pair construction into a `vpermw` of the
/// widened scales, which is slower on Zen 4.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn permd(idx: __m512i, v: __m512i) -> __m512i {
    let r: __m512i;
    // SAFETY: register operands only.
    unsafe {
        core::arch::asm!(
            "vpermd {r}, {i}, {v}",
            r = lateout(zmm_reg) r,
            i = in(zmm_reg) idx,
            v = in(zmm_reg) v,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    r
}

/// `Σ₄ q·y` per u32 lane: a `vpdpbusd` of the codes `q` (u8) and the 64 activation bytes at `y` (i8) into
/// zero, the load folded into it (LLVM would hoist the activation loads out of the row loop and spill
/// them).
///
/// # Safety
/// `y` must point to 64 readable bytes; the CPU must have AVX-512 F and VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpbusd_fresh(q: __m512i, y: *const u8) -> __m512i {
    let mut r = _mm512_setzero_si512();
    // SAFETY: reads the 64 bytes at `y`, which the caller guarantees; no other memory.
    unsafe {
        core::arch::asm!(
            "vpdpbusd {r}, {q}, zmmword ptr [{y}]",
            r = inout(zmm_reg) r,
            q = in(zmm_reg) q,
            y = in(reg) y,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    r
}
