//! Activation quantizers (Q8_0, Q8_1, Q8_K), byte-identical to the scalar references in `crate::quant`:
//! the scale is computed in scalar f32 exactly as there; only the per-element multiply, rounding and
//! narrowing are vectorized (`fcvtas` = `roundf`, ties away from zero, for Q8_0/Q8_1; `fcvtns` = ties to
//! even, ggml's `nearest_int`, for Q8_K). Blocks where the vector path could differ — a NaN or infinite
//! input, or a scale whose reciprocal overflows — are handed to the scalar reference.

use core::arch::aarch64::*;

use crate::quant::{self, f16_from_f32, GgmlType, QK_K};

/// The 32 or 256 inputs of a block as f32x4 vectors.
#[inline(always)]
unsafe fn load<const N: usize>(x: &[f32]) -> [float32x4_t; N] {
    debug_assert_eq!(x.len(), 4 * N);
    std::array::from_fn(|i| vld1q_f32(x.as_ptr().add(4 * i)))
}

/// max |v| over the vectors; NaN if any input is NaN.
#[inline(always)]
unsafe fn abs_max(v: &[float32x4_t]) -> f32 {
    let mut m = vdupq_n_f32(0.0);
    for &v in v {
        m = vmaxq_f32(m, vabsq_f32(v));
    }
    vmaxvq_f32(m)
}

/// Narrows 16 i32 (already in i8 range) to 16 bytes.
#[inline(always)]
unsafe fn narrow(q: [int32x4_t; 4]) -> int8x16_t {
    let lo = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
    let hi = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
    vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi))
}

/// One Q8_0 (`with_sum` false) or Q8_1 block of 32 into `out` (34 or 36 bytes). Returns false, having
/// written nothing, where only the scalar reference is exact.
#[inline(always)]
unsafe fn q8_block(x: &[f32], out: &mut [u8], with_sum: bool) -> bool {
    let v: [float32x4_t; 8] = load(x);
    let amax = abs_max(&v);
    if !amax.is_finite() {
        return false;
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    if !id.is_finite() {
        return false;
    }
    let q: [int32x4_t; 8] = std::array::from_fn(|i| vcvtaq_s32_f32(vmulq_n_f32(v[i], id)));
    let q0 = narrow([q[0], q[1], q[2], q[3]]);
    let q1 = narrow([q[4], q[5], q[6], q[7]]);
    let head = if with_sum { 4 } else { 2 };
    out[..2].copy_from_slice(&f16_from_f32(d).to_le_bytes());
    if with_sum {
        let sum = vaddlvq_s8(q0) as i32 + vaddlvq_s8(q1) as i32;
        out[2..4].copy_from_slice(&f16_from_f32(sum as f32 * d).to_le_bytes());
    }
    let qs = &mut out[head..head + 32];
    vst1q_s8(qs.as_mut_ptr() as *mut i8, q0);
    vst1q_s8(qs.as_mut_ptr().add(16) as *mut i8, q1);
    true
}

/// One Q8_K block of 256 into `out` (292 bytes); false where only the scalar reference is exact.
#[inline(always)]
unsafe fn q8k_block(x: &[f32], out: &mut [u8]) -> bool {
    let v: [float32x4_t; 64] = load(x);
    let amax = abs_max(&v);
    if !amax.is_finite() {
        return false;
    }
    if amax == 0.0 {
        out.fill(0);
        return true;
    }
    // The first element of largest magnitude gives the sign (the reference's strict `>` scan).
    let max = *x
        .iter()
        .find(|v| v.abs() == amax)
        .expect("amax is an element");
    let iscale = -127.0 / max;
    if !iscale.is_finite() {
        return false;
    }
    let cap = vdupq_n_s32(127);
    out[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    for (g, v) in v.chunks_exact(4).enumerate() {
        let q: [int32x4_t; 4] =
            std::array::from_fn(|i| vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(v[i], iscale)), cap));
        let q = narrow(q);
        vst1q_s8(out.as_mut_ptr().add(4 + 16 * g) as *mut i8, q);
        let bsum = vaddlvq_s8(q);
        out[260 + 2 * g..262 + 2 * g].copy_from_slice(&bsum.to_le_bytes());
    }
    true
}

/// The `quantize_act` entry of both NEON tables.
pub(super) fn quantize_act(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    let (block, bytes) = match ty {
        GgmlType::Q8_0 => (32, 34),
        GgmlType::Q8_1 => (32, 36),
        GgmlType::Q8_K => (QK_K, 292),
        other => return quant::quantize_row(other, x, out).expect("lengths match"),
    };
    assert!(
        x.len().is_multiple_of(block) && out.len() == x.len() / block * bytes,
        "{ty}: {} floats cannot be quantized into {} bytes",
        x.len(),
        out.len()
    );
    for (x, o) in x.chunks_exact(block).zip(out.chunks_exact_mut(bytes)) {
        // SAFETY: NEON is part of the aarch64 baseline; the block functions only read `x` (exactly one
        // block, as `load` requires) and write within `o` (exactly one output block).
        let done = unsafe {
            match ty {
                GgmlType::Q8_K => q8k_block(x, o),
                _ => q8_block(x, o, ty == GgmlType::Q8_1),
            }
        };
        if !done {
            quant::quantize_row(ty, x, o).expect("one block");
        }
    }
}
