//! Shared pieces of the lattice-codebook kernels (IQ3, IQ2, IQ1 against Q8_K): grid points gathered from
//! the tables of `quant::iq::grids` into vectors, sign bits expanded to lane masks, and the exact i32
//! sub-block sums.
//!
//! Every kernel of these formats reproduces its scalar reference bit for bit: the integer sums of a
//! super-block are exact in any association, and the float steps (`d·bsum` per block, the row's final
//! factor) are the reference's, in its order.

use core::arch::aarch64::*;

use super::neon::{ld_s8, Dot};

/// Sign byte `k` of a packed u32 (little-endian) broadcast to lanes `8k..8k+8`, for the two halves of 32
/// values.
static SIGN_BYTE: [u8; 32] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
];

/// Lane `j` of each 8 tests bit `j` of its sign byte.
static SIGN_BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];

/// Negation masks (all ones where negative) of 32 values from their 4 sign bytes packed little-endian
/// in `s`: bit `j` of byte `k` is the sign of value `8k + j`. Returns values 0..16 and 16..32.
#[inline(always)]
pub(super) unsafe fn sign_masks(s: u32) -> (int8x16_t, int8x16_t) {
    let v = vreinterpretq_u8_u32(vdupq_n_u32(s));
    let bit = vld1q_u8(SIGN_BIT.as_ptr());
    let lo = vqtbl1q_u8(v, vld1q_u8(SIGN_BYTE.as_ptr()));
    let hi = vqtbl1q_u8(v, vld1q_u8(SIGN_BYTE.as_ptr().add(16)));
    (
        vreinterpretq_s8_u8(vtstq_u8(lo, bit)),
        vreinterpretq_s8_u8(vtstq_u8(hi, bit)),
    )
}

/// `v` negated where `neg` is all ones (`(v ^ m) − m`); grid magnitudes are < 128, so no overflow.
#[inline(always)]
pub(super) unsafe fn apply_signs(v: int8x16_t, neg: int8x16_t) -> int8x16_t {
    vsubq_s8(veorq_s8(v, neg), neg)
}

/// Two 8-value grid points (u64 table entries, byte `j` = value `j`) as one vector.
#[inline(always)]
pub(super) unsafe fn points8(a: u64, b: u64) -> int8x16_t {
    vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(a), vcreate_u64(b)))
}

/// Four 4-value grid points (u32 table entries, byte `j` = value `j`) as one vector.
#[inline(always)]
pub(super) unsafe fn points4(p: [u32; 4]) -> int8x16_t {
    vreinterpretq_s8_u32(vld1q_u32(p.as_ptr()))
}

/// The 4 sign bytes of 32 values from their four 7-bit sign-pattern fields (bits `7k..7k+7` of `aux`),
/// through the even-parity table.
#[inline(always)]
pub(super) fn parity_signs(aux: u32) -> u32 {
    use crate::quant::iq::grids::KSIGNS_IQ2XS;
    (0..4).fold(0, |s, k| {
        s | (KSIGNS_IQ2XS[((aux >> (7 * k)) & 127) as usize] as u32) << (8 * k)
    })
}

/// Σ v·y over 32 values (`v0`, `v1` against the 32 activation bytes at `y`), in i32 lanes.
#[inline(always)]
pub(super) unsafe fn dot32<D: Dot>(v0: int8x16_t, v1: int8x16_t, y: *const u8) -> int32x4_t {
    D::dot(D::dot(vdupq_n_s32(0), v0, ld_s8(y)), v1, ld_s8(y.add(16)))
}

/// Σ v·y over 16 values, in i32 lanes.
#[inline(always)]
pub(super) unsafe fn dot16<D: Dot>(v: int8x16_t, y: *const u8) -> int32x4_t {
    D::dot(vdupq_n_s32(0), v, ld_s8(y))
}
