//! Block kernels of the K-quants against Q8_K (spec gguf-and-quants §3.8–3.14, §5.3).
//!
//! Per super-block: sub-block dot products (exact, i32 lanes) are multiplied by their integer scales and
//! accumulated in i32 (|Σ| < 2^31, §5.3); the result is scaled by `d·dy` into the row's f32 lanes. Mins
//! (Q2_K, Q4_K, Q5_K) come from the activation's `bsums` and go to the row's scalar part.

use core::arch::aarch64::*;

use super::neon::{h2f, ld_f32, ld_s8, ld_u16, ld_u32, Acc, Block, Dot};

/// Q8_K: `d` f32, 256 quants, 16 `bsums`.
pub(super) const Q8K_QS: usize = 4;
pub(super) const Q8K_BSUMS: usize = 260;
pub(super) const Q8K_BYTES: usize = 292;

/// `acc += Σ(x·y over 16 bytes) · scale` in i32 lanes.
#[inline(always)]
unsafe fn sub16<D: Dot>(acc: int32x4_t, x: uint8x16_t, y: *const u8, scale: i32) -> int32x4_t {
    let p = D::dot(vdupq_n_s32(0), vreinterpretq_s8_u8(x), ld_s8(y));
    vmlaq_n_s32(acc, p, scale)
}

/// Same with signed weight bytes.
#[inline(always)]
unsafe fn sub16s<D: Dot>(acc: int32x4_t, x: int8x16_t, y: *const u8, scale: i32) -> int32x4_t {
    vmlaq_n_s32(acc, D::dot(vdupq_n_s32(0), x, ld_s8(y)), scale)
}

/// `acc += Σ(x·y over 32 bytes) · scale` in i32 lanes.
#[inline(always)]
unsafe fn sub32<D: Dot>(
    acc: int32x4_t,
    x0: uint8x16_t,
    x1: uint8x16_t,
    y: *const u8,
    scale: i32,
) -> int32x4_t {
    let p = D::dot(vdupq_n_s32(0), vreinterpretq_s8_u8(x0), ld_s8(y));
    let p = D::dot(p, vreinterpretq_s8_u8(x1), ld_s8(y.add(16)));
    vmlaq_n_s32(acc, p, scale)
}

/// Σ_j bsums[j]·mins[j] for 16 i16 `bsums` and 16 small unsigned `mins` (bytes).
#[inline(always)]
unsafe fn bsums_dot16(y: *const u8, mins: uint8x16_t) -> i32 {
    let b0 = vreinterpretq_s16_u8(vld1q_u8(y.add(Q8K_BSUMS)));
    let b1 = vreinterpretq_s16_u8(vld1q_u8(y.add(Q8K_BSUMS + 16)));
    let m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
    let m1 = vreinterpretq_s16_u16(vmovl_high_u8(mins));
    let p = vmull_s16(vget_low_s16(b0), vget_low_s16(m0));
    let p = vmlal_high_s16(p, b0, m0);
    let p = vmlal_s16(p, vget_low_s16(b1), vget_low_s16(m1));
    let p = vmlal_high_s16(p, b1, m1);
    vaddvq_s32(p)
}

/// Σ_j (bsums[2j] + bsums[2j+1])·mins[j] for the 8 mins of the 32-element sub-blocks.
#[inline(always)]
unsafe fn bsums_dot8(y: *const u8, mins: [u8; 8]) -> i32 {
    let b0 = vreinterpretq_s16_u8(vld1q_u8(y.add(Q8K_BSUMS)));
    let b1 = vreinterpretq_s16_u8(vld1q_u8(y.add(Q8K_BSUMS + 16)));
    // Pairs of 16-element sums: |·| ≤ 2·16·128, no i16 overflow.
    let pairs = vpaddq_s16(b0, b1);
    let m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mins.as_ptr())));
    let p = vmull_s16(vget_low_s16(pairs), vget_low_s16(m));
    vaddvq_s32(vmlal_high_s16(p, pairs, m))
}

/// The 8 scales and 8 mins of Q4_K/Q5_K from their 12-byte packing (§3.8), four at a time per u32.
#[inline(always)]
pub(super) unsafe fn scales_mins(p: *const u8) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let (b0, b1, b2) = (ld_u32(p), ld_u32(p.add(4)), ld_u32(p.add(8)));
    let s_lo = b0 & LOW6;
    let m_lo = b1 & LOW6;
    let s_hi = (b2 & LOW4) | (((b0 >> 6) & LOW2) << 4);
    let m_hi = ((b2 >> 4) & LOW4) | (((b1 >> 6) & LOW2) << 4);
    let cat = |a: u32, b: u32| (a as u64 | (b as u64) << 32).to_le_bytes();
    (cat(s_lo, s_hi), cat(m_lo, m_hi))
}

/// The 16 signed Q3_K scales (`u − 32`) from their 12-byte packing (§3.10).
#[inline(always)]
pub(super) unsafe fn q3_scales(p: *const u8) -> [i8; 16] {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let (b0, b1, b2) = (ld_u32(p), ld_u32(p.add(4)), ld_u32(p.add(8)));
    let words = [
        (b0 & LOW4) | ((b2 & LOW2) << 4),
        (b1 & LOW4) | (((b2 >> 2) & LOW2) << 4),
        ((b0 >> 4) & LOW4) | (((b2 >> 4) & LOW2) << 4),
        ((b1 >> 4) & LOW4) | (((b2 >> 6) & LOW2) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        for (o, b) in o.iter_mut().zip(w.to_le_bytes()) {
            *o = b as i8 - 32;
        }
    }
    out
}

pub(super) struct Q2K;

impl Block for Q2K {
    const W: usize = 84;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let sc = vld1q_u8(x);
        let msum = bsums_dot16(y, vshrq_n_u8::<4>(sc));
        let mut scales = [0u8; 16];
        vst1q_u8(scales.as_mut_ptr(), vandq_u8(sc, vdupq_n_u8(0x0F)));
        let three = vdupq_n_u8(3);
        let mut isum = vdupq_n_s32(0);
        for h in 0..2 {
            let mut q0 = vld1q_u8(x.add(16 + 32 * h));
            let mut q1 = vld1q_u8(x.add(16 + 32 * h + 16));
            for j in 0..4 {
                let k = 8 * h + 2 * j;
                let yj = y.add(Q8K_QS + 128 * h + 32 * j);
                isum = sub16::<D>(isum, vandq_u8(q0, three), yj, scales[k] as i32);
                isum = sub16::<D>(isum, vandq_u8(q1, three), yj.add(16), scales[k + 1] as i32);
                q0 = vshrq_n_u8::<2>(q0);
                q1 = vshrq_n_u8::<2>(q1);
            }
        }
        let dy = ld_f32(y);
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(isum), dy * h2f(ld_u16(x.add(80))));
        acc.s -= dy * h2f(ld_u16(x.add(82))) * msum as f32;
    }
}

pub(super) struct Q3K;

/// Half `h` of a Q3_K block (columns `128h..128h+128`) as signed codes `q − 4`, quarter by quarter:
/// `[j] = (columns 32j..32j+16, 32j+16..32j+32)` of the half. Bit `4h + j` of `hmask[l]` is the high bit
/// of column `128h + 32j + l`; `q − 4 = low2 − (4 where the high bit is clear)`. Shared by the row kernel
/// and the GEMM's panel decoder.
///
/// # Safety
/// `x` must be readable for a whole Q3_K block (110 bytes), `h < 2`.
#[inline(always)]
pub(super) unsafe fn q3k_half(x: *const u8, h: usize) -> [(int8x16_t, int8x16_t); 4] {
    let three = vdupq_n_u8(3);
    let four = vdupq_n_u8(4);
    let (mut hm0, mut hm1) = (vld1q_u8(x), vld1q_u8(x.add(16)));
    if h == 1 {
        hm0 = vshrq_n_u8::<4>(hm0);
        hm1 = vshrq_n_u8::<4>(hm1);
    }
    let mut q0 = vld1q_u8(x.add(32 + 32 * h));
    let mut q1 = vld1q_u8(x.add(32 + 32 * h + 16));
    core::array::from_fn(|_| {
        let c0 = vbicq_u8(four, vshlq_n_u8::<2>(hm0));
        let c1 = vbicq_u8(four, vshlq_n_u8::<2>(hm1));
        let v0 = vsubq_s8(
            vreinterpretq_s8_u8(vandq_u8(q0, three)),
            vreinterpretq_s8_u8(c0),
        );
        let v1 = vsubq_s8(
            vreinterpretq_s8_u8(vandq_u8(q1, three)),
            vreinterpretq_s8_u8(c1),
        );
        q0 = vshrq_n_u8::<2>(q0);
        q1 = vshrq_n_u8::<2>(q1);
        hm0 = vshrq_n_u8::<1>(hm0);
        hm1 = vshrq_n_u8::<1>(hm1);
        (v0, v1)
    })
}

impl Block for Q3K {
    const W: usize = 110;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let scales = q3_scales(x.add(96));
        let mut isum = vdupq_n_s32(0);
        for h in 0..2 {
            for (j, (v0, v1)) in q3k_half(x, h).into_iter().enumerate() {
                let k = 8 * h + 2 * j;
                let yj = y.add(Q8K_QS + 128 * h + 32 * j);
                isum = sub16s::<D>(isum, v0, yj, scales[k] as i32);
                isum = sub16s::<D>(isum, v1, yj.add(16), scales[k + 1] as i32);
            }
        }
        let d = h2f(ld_u16(x.add(108))) * ld_f32(y);
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(isum), d);
    }
}

pub(super) struct Q4K;

impl Block for Q4K {
    const W: usize = 144;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let (scales, mins) = scales_mins(x.add(4));
        let msum = bsums_dot8(y, mins);
        let m4 = vdupq_n_u8(0x0F);
        let mut isum = vdupq_n_s32(0);
        for c in 0..4 {
            let q0 = vld1q_u8(x.add(16 + 32 * c));
            let q1 = vld1q_u8(x.add(16 + 32 * c + 16));
            let yc = y.add(Q8K_QS + 64 * c);
            let (l0, l1) = (vandq_u8(q0, m4), vandq_u8(q1, m4));
            let (h0, h1) = (vshrq_n_u8::<4>(q0), vshrq_n_u8::<4>(q1));
            isum = sub32::<D>(isum, l0, l1, yc, scales[2 * c] as i32);
            isum = sub32::<D>(isum, h0, h1, yc.add(32), scales[2 * c + 1] as i32);
        }
        let dy = ld_f32(y);
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(isum), h2f(ld_u16(x)) * dy);
        acc.s -= h2f(ld_u16(x.add(2))) * dy * msum as f32;
    }
}

pub(super) struct Q5K;

impl Block for Q5K {
    const W: usize = 176;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let (scales, mins) = scales_mins(x.add(4));
        let msum = bsums_dot8(y, mins);
        let m4 = vdupq_n_u8(0x0F);
        let sixteen = vdupq_n_u8(0x10);
        // Bit 2c of qh[l] is the fifth bit of element 64c + l, bit 2c+1 that of 64c + 32 + l.
        let mut qh0 = vld1q_u8(x.add(16));
        let mut qh1 = vld1q_u8(x.add(32));
        let mut isum = vdupq_n_s32(0);
        for c in 0..4 {
            let q0 = vld1q_u8(x.add(48 + 32 * c));
            let q1 = vld1q_u8(x.add(48 + 32 * c + 16));
            let yc = y.add(Q8K_QS + 64 * c);
            let l0 = vorrq_u8(vandq_u8(q0, m4), vandq_u8(vshlq_n_u8::<4>(qh0), sixteen));
            let l1 = vorrq_u8(vandq_u8(q1, m4), vandq_u8(vshlq_n_u8::<4>(qh1), sixteen));
            let h0 = vorrq_u8(vshrq_n_u8::<4>(q0), vandq_u8(vshlq_n_u8::<3>(qh0), sixteen));
            let h1 = vorrq_u8(vshrq_n_u8::<4>(q1), vandq_u8(vshlq_n_u8::<3>(qh1), sixteen));
            isum = sub32::<D>(isum, l0, l1, yc, scales[2 * c] as i32);
            isum = sub32::<D>(isum, h0, h1, yc.add(32), scales[2 * c + 1] as i32);
            qh0 = vshrq_n_u8::<2>(qh0);
            qh1 = vshrq_n_u8::<2>(qh1);
        }
        let dy = ld_f32(y);
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(isum), h2f(ld_u16(x)) * dy);
        acc.s -= h2f(ld_u16(x.add(2))) * dy * msum as f32;
    }
}

pub(super) struct Q6K;

/// Half `h` of a Q6_K block (columns `128h..128h+128`) as signed codes `q − 32`, quarter by quarter:
/// `[j] = (columns 32j..32j+16, 32j+16..32j+32)` of the half. Quarter j takes the low nibbles of `ql`'s
/// first 32 bytes (j = 0), of the next 32 (1), their high nibbles (2, 3), and bits 2j..2j+2 of `qh` as
/// bits 4..6. Shared by the row kernel and the GEMM's panel decoder.
///
/// # Safety
/// `x` must be readable for a whole Q6_K block (210 bytes), `h < 2`.
#[inline(always)]
pub(super) unsafe fn q6k_half(x: *const u8, h: usize) -> [(int8x16_t, int8x16_t); 4] {
    let m4 = vdupq_n_u8(0x0F);
    let m30 = vdupq_n_u8(0x30);
    let bias = vdupq_n_s8(32);
    let ql = x.add(64 * h);
    let qh = x.add(128 + 32 * h);
    let (a0, a1) = (vld1q_u8(ql), vld1q_u8(ql.add(16)));
    let (b0, b1) = (vld1q_u8(ql.add(32)), vld1q_u8(ql.add(48)));
    let (h0, h1) = (vld1q_u8(qh), vld1q_u8(qh.add(16)));
    let quarters = [
        (
            vandq_u8(a0, m4),
            vandq_u8(a1, m4),
            vandq_u8(vshlq_n_u8::<4>(h0), m30),
            vandq_u8(vshlq_n_u8::<4>(h1), m30),
        ),
        (
            vandq_u8(b0, m4),
            vandq_u8(b1, m4),
            vandq_u8(vshlq_n_u8::<2>(h0), m30),
            vandq_u8(vshlq_n_u8::<2>(h1), m30),
        ),
        (
            vshrq_n_u8::<4>(a0),
            vshrq_n_u8::<4>(a1),
            vandq_u8(h0, m30),
            vandq_u8(h1, m30),
        ),
        (
            vshrq_n_u8::<4>(b0),
            vshrq_n_u8::<4>(b1),
            vandq_u8(vshrq_n_u8::<2>(h0), m30),
            vandq_u8(vshrq_n_u8::<2>(h1), m30),
        ),
    ];
    quarters.map(|(lo0, lo1, hi0, hi1)| {
        (
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo0, hi0)), bias),
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo1, hi1)), bias),
        )
    })
}

impl Block for Q6K {
    const W: usize = 210;
    const A: usize = Q8K_BYTES;

    #[inline(always)]
    unsafe fn dot<D: Dot>(acc: &mut Acc, x: *const u8, y: *const u8) {
        let sc = x.add(192) as *const i8;
        let mut isum = vdupq_n_s32(0);
        for h in 0..2 {
            for (j, (v0, v1)) in q6k_half(x, h).into_iter().enumerate() {
                let k = 8 * h + 2 * j;
                let yj = y.add(Q8K_QS + 128 * h + 32 * j);
                isum = sub16s::<D>(isum, v0, yj, *sc.add(k) as i32);
                isum = sub16s::<D>(isum, v1, yj.add(16), *sc.add(k + 1) as i32);
            }
        }
        let d = h2f(ld_u16(x.add(208))) * ld_f32(y);
        acc.v = vfmaq_n_f32(acc.v, vcvtq_f32_s32(isum), d);
    }
}
