//! The 32-element formats: Q4_0, Q5_0, Q8_0, IQ4_NL × Q8_0 and Q4_1, Q5_1 × Q8_1.
//!
//! Per block: unsigned codes `q` (Q4_0/Q5_0 unpacked without their offset) are multiplied with the
//! activation bytes by `dot_u8i8`, and the offset is taken off afterwards with the activation's own sum:
//! `Σ (q − o)·y = Σ q·y − o·Σ y` (exact in i32; the sums of y are computed once per token and block
//! and shared by the tile's rows). Q8_0 and IQ4_NL weights
//! (nibbles looked up in the level table) are signed: the sign trick `|x| · (y·sign x)`.

use core::arch::x86_64::*;

use super::{f16_at, hsum_ps, loadu, loadu128, read_u32, QuantTile, Simd, StreamPrefetch};

/// How a format's codes enter the product.
#[derive(PartialEq, Eq)]
enum Kind {
    /// `Σ q·y − offset·Σ y` with `q` unsigned.
    Offset(i32),
    /// `Σ q·y` plus the min term `m·s` (Q8_1 activations).
    Affine,
    /// Signed weights (Q8_0).
    Signed,
}

trait Legacy {
    const WB: usize;
    const AB: usize;
    const KIND: Kind;
    /// The block's 32 codes in element order, its scale and (affine formats) min.
    unsafe fn unpack(p: *const u8) -> (__m256i, f32, f32);
}

/// 16 bytes of nibbles → 32 bytes: low nibbles (elements 0..16) then high nibbles (16..32).
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let v = loadu128(p);
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(v), v);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// 0x10 in byte `e` where bit `e` of `qh` is set.
#[inline(always)]
unsafe fn fifth_bits(qh: u32) -> __m256i {
    let v = _mm256_set1_epi32(qh as i32);
    // Byte e takes byte e/8 of qh.
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
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

macro_rules! legacy_format {
    ($name:ident, $wb:expr, $ab:expr, $kind:expr, |$p:ident| $body:block) => {
        #[allow(non_camel_case_types)]
        pub(crate) struct $name;
        impl Legacy for $name {
            const WB: usize = $wb;
            const AB: usize = $ab;
            const KIND: Kind = $kind;
            #[inline(always)]
            unsafe fn unpack($p: *const u8) -> (__m256i, f32, f32) {
                $body
            }
        }
        impl QuantTile for $name {
            const WB: usize = $wb;
            const AB: usize = $ab;
            #[inline(always)]
            unsafe fn tile<S: Simd, const R: usize, const T: usize>(
                w: [*const u8; R],
                a: [*const u8; T],
                nb: usize,
            ) -> [[f32; T]; R] {
                legacy_tile::<S, $name, R, T>(w, a, nb, T == 1)
            }
            #[inline(always)]
            unsafe fn stream<S: Simd, const R: usize, const T: usize>(
                w: [*const u8; R],
                a: [*const u8; T],
                nb: usize,
            ) -> [[f32; T]; R] {
                legacy_tile::<S, $name, R, T>(w, a, nb, true)
            }
        }
    };
}

legacy_format!(Q4_0, 18, 34, Kind::Offset(8), |p| {
    (nibbles(p.add(2)), f16_at(p), 0.0)
});
legacy_format!(Q4_1, 20, 36, Kind::Affine, |p| {
    (nibbles(p.add(4)), f16_at(p), f16_at(p.add(2)))
});
legacy_format!(Q5_0, 22, 34, Kind::Offset(16), |p| {
    let q = _mm256_or_si256(nibbles(p.add(6)), fifth_bits(read_u32(p.add(2))));
    (q, f16_at(p), 0.0)
});
legacy_format!(Q5_1, 24, 36, Kind::Affine, |p| {
    let q = _mm256_or_si256(nibbles(p.add(8)), fifth_bits(read_u32(p.add(4))));
    (q, f16_at(p), f16_at(p.add(2)))
});
legacy_format!(Q8_0, 34, 34, Kind::Signed, |p| {
    (loadu(p.add(2)), f16_at(p), 0.0)
});
// IQ4_NL: the nibbles index the 16 non-linear levels (signed, |level| ≤ 127).
legacy_format!(IQ4NL, 18, 34, Kind::Signed, |p| {
    (iq4_levels(nibbles(p.add(2))), f16_at(p), 0.0)
});

/// Codes 0..16 in each byte → `KVALUES_IQ4NL[code]` (a 16-entry `pshufb` table in both lanes).
#[inline(always)]
pub(crate) unsafe fn iq4_levels(codes: __m256i) -> __m256i {
    let table = loadu128(crate::quant::iq::grids::KVALUES_IQ4NL.as_ptr() as *const u8);
    _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), codes)
}

/// `R` rows × `T` tokens; `prefetch`: the rows are streamed from memory (decode layout), so request them
/// ahead of the reads ([`StreamPrefetch`]).
#[inline(always)]
unsafe fn legacy_tile<S: Simd, K: Legacy, const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
    prefetch: bool,
) -> [[f32; T]; R] {
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut macc = [[0f32; T]; R];
    let shift = match K::KIND {
        Kind::Offset(o) => o.trailing_zeros() as i32,
        _ => 0,
    };
    let qoff = K::AB - 32;
    let mut pf = StreamPrefetch::new(w);
    for b in 0..nb {
        if prefetch {
            pf.upto((b + 1) * K::WB);
        }
        let mut q = [zero; R];
        let mut qa = [zero; R];
        let mut dx = [0f32; R];
        let mut mx = [0f32; R];
        for r in 0..R {
            let (v, d, m) = K::unpack(w[r].add(b * K::WB));
            q[r] = v;
            dx[r] = d;
            mx[r] = m;
            if K::KIND == Kind::Signed {
                qa[r] = _mm256_sign_epi8(v, v);
            }
        }
        for t in 0..T {
            let ap = a[t].add(b * K::AB);
            let dy = f16_at(ap);
            let y = loadu(ap.add(qoff));
            let ysum = if let Kind::Offset(_) = K::KIND {
                _mm256_sll_epi32(
                    S::dot_u8i8(zero, _mm256_set1_epi8(1), y),
                    _mm_cvtsi32_si128(shift),
                )
            } else {
                zero
            };
            let sy = if K::KIND == Kind::Affine {
                f16_at(ap.add(2))
            } else {
                0.0
            };
            for r in 0..R {
                let p = match K::KIND {
                    Kind::Signed => S::dot_u8i8(zero, qa[r], _mm256_sign_epi8(y, q[r])),
                    Kind::Offset(_) => _mm256_sub_epi32(S::dot_u8i8(zero, q[r], y), ysum),
                    Kind::Affine => S::dot_u8i8(zero, q[r], y),
                };
                acc[r][t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dx[r] * dy), acc[r][t]);
                if K::KIND == Kind::Affine {
                    macc[r][t] += mx[r] * sy;
                }
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum_ps(acc[r][t]) + macc[r][t];
        }
    }
    out
}
