//! Activation quantizers (Q8_0, Q8_1, Q8_K) producing exactly the reference bytes.
//!
//! The reference's scalar arithmetic is reproduced lane by lane: the same f32 operations in the same
//! order, `roundf` (half away from zero) for Q8_0/Q8_1 and ggml's `nearest_int` bit trick for Q8_K, and
//! C's truncating float → int → byte conversion (low byte kept, never saturated). Only the maximum
//! search is reordered, which is exact for NaN-free blocks; a block holding a NaN goes to the scalar
//! reference (its NaN-dependent maximum depends on the order).

use core::arch::x86_64::*;

use crate::quant::{self, f16_from_f32, GgmlType};

/// Low byte of each i32 lane of `a` (8 bytes) then of `b`, ... : packs four vectors of 8 i32 into 32 bytes
/// in order, truncating (not saturating).
#[inline(always)]
unsafe fn low_bytes(v: [__m256i; 4]) -> __m256i {
    // Within each 128-bit lane, bytes 0,4,8,12 → positions 0..4 (the rest zeroed).
    let shuf = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1,
        -1, -1, -1, -1, -1, -1, -1, -1,
    );
    let mut parts = [_mm256_setzero_si256(); 4];
    for (p, v) in parts.iter_mut().zip(v) {
        // Dword 0 of each lane holds 4 bytes: lane 0 → elements 0..4, lane 1 → 4..8.
        *p = _mm256_permutevar8x32_epi32(
            _mm256_shuffle_epi8(v, shuf),
            _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1),
        );
    }
    // parts[i] dwords 0..2 hold elements 8i..8i+8 (8 bytes in its low 64 bits).
    let lo = _mm256_unpacklo_epi64(parts[0], parts[1]); // lane0: e0..16
    let hi = _mm256_unpacklo_epi64(parts[2], parts[3]); // lane0: e16..32
    _mm256_permute2x128_si256::<0x20>(lo, hi)
}

/// Max |x| over `x` (a multiple of 8 long), or `None` if a NaN is present.
#[inline(always)]
unsafe fn abs_max_no_nan(x: &[f32]) -> Option<f32> {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    let mut nan = _mm256_setzero_ps();
    for c in x.chunks_exact(8) {
        let v = _mm256_loadu_ps(c.as_ptr());
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
    }
    if _mm256_movemask_ps(nan) != 0 {
        return None;
    }
    let s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_movehdup_ps(s));
    Some(_mm_cvtss_f32(s))
}

/// `roundf(v)` (half away from zero) on each lane, then C's `(int)` truncation.
#[inline(always)]
unsafe fn round_away_to_i32(v: __m256) -> __m256i {
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
    let frac = _mm256_sub_ps(v, t);
    let half = _mm256_cmp_ps::<_CMP_GE_OQ>(
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), frac),
        _mm256_set1_ps(0.5),
    );
    let one = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0)), _mm256_set1_ps(1.0));
    let r = _mm256_add_ps(t, _mm256_and_ps(half, one));
    _mm256_cvttps_epi32(r)
}

/// One Q8_0/Q8_1 block: returns `(d, qs)` as the reference computes them, or `None` for NaN blocks.
#[inline(always)]
unsafe fn q8_block(x: &[f32]) -> Option<(f32, __m256i)> {
    let amax = abs_max_no_nan(x)?;
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    let mut q = [_mm256_setzero_si256(); 4];
    for (i, q) in q.iter_mut().enumerate() {
        *q = round_away_to_i32(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * i)), idv));
    }
    Some((d, low_bytes(q)))
}

/// Sum of 32 i8.
#[inline(always)]
unsafe fn sum_i8(v: __m256i) -> i32 {
    let w = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_set1_epi8(1), v),
        _mm256_set1_epi16(1),
    );
    let s = _mm_add_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

#[inline(always)]
unsafe fn q8_0(x: &[f32], out: &mut [u8]) {
    for (x, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        match q8_block(x) {
            Some((d, q)) => {
                o[..2].copy_from_slice(&f16_from_f32(d).to_le_bytes());
                _mm256_storeu_si256(o.as_mut_ptr().add(2) as *mut __m256i, q);
            }
            None => quant::quantize_row(GgmlType::Q8_0, x, o).expect("one block"),
        }
    }
}

#[inline(always)]
unsafe fn q8_1(x: &[f32], out: &mut [u8]) {
    for (x, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(36)) {
        match q8_block(x) {
            Some((d, q)) => {
                // Σ of the stored (truncated) bytes: the i8 values the reference sums.
                let s = sum_i8(q);
                o[..2].copy_from_slice(&f16_from_f32(d).to_le_bytes());
                o[2..4].copy_from_slice(&f16_from_f32(s as f32 * d).to_le_bytes());
                _mm256_storeu_si256(o.as_mut_ptr().add(4) as *mut __m256i, q);
            }
            None => quant::quantize_row(GgmlType::Q8_1, x, o).expect("one block"),
        }
    }
}

#[inline(always)]
unsafe fn q8_k(x: &[f32], out: &mut [u8]) {
    for (x, o) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        let Some(amax) = abs_max_no_nan(x) else {
            quant::quantize_row(GgmlType::Q8_K, x, o).expect("one block");
            continue;
        };
        if amax == 0.0 {
            o.fill(0);
            continue;
        }
        // The reference keeps the first element of largest magnitude (with its sign).
        let max = *x
            .iter()
            .find(|v| v.abs() == amax)
            .expect("the maximum is an element");
        let iscale = -127.0 / max;
        let sv = _mm256_set1_ps(iscale);
        let magic = _mm256_set1_ps(12_582_912.0);
        for c in 0..8 {
            let mut q = [_mm256_setzero_si256(); 4];
            for (i, q) in q.iter_mut().enumerate() {
                let v = _mm256_loadu_ps(x.as_ptr().add(32 * c + 8 * i));
                // nearest_int: (bits(v·iscale + 1.5·2^23) & 0x7fffff) − 0x400000, then min(127).
                let f = _mm256_add_ps(_mm256_mul_ps(sv, v), magic);
                let n = _mm256_sub_epi32(
                    _mm256_and_si256(_mm256_castps_si256(f), _mm256_set1_epi32(0x007f_ffff)),
                    _mm256_set1_epi32(0x0040_0000),
                );
                *q = _mm256_min_epi32(n, _mm256_set1_epi32(127));
            }
            let bytes = low_bytes(q);
            _mm256_storeu_si256(o.as_mut_ptr().add(4 + 32 * c) as *mut __m256i, bytes);
            // Block sums of 16: sign-extend each half to i16 and add horizontally.
            let lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes));
            let hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(bytes));
            let w = _mm256_madd_epi16(_mm256_hadd_epi16(lo, hi), _mm256_set1_epi16(1));
            // hadd(lo, hi) holds pair sums [lo 0..8, hi 0..8 | lo 8..16, hi 8..16] (by element);
            // madd(·, 1) makes dwords of 4 elements: [lo 0..4, lo 4..8, hi 0..4, hi 4..8 | the same for 8..16].
            let mut d = [0i32; 8];
            _mm256_storeu_si256(d.as_mut_ptr() as *mut __m256i, w);
            let s_lo = d[0] + d[1] + d[4] + d[5];
            let s_hi = d[2] + d[3] + d[6] + d[7];
            o[260 + 4 * c..262 + 4 * c].copy_from_slice(&(s_lo as i16).to_le_bytes());
            o[262 + 4 * c..264 + 4 * c].copy_from_slice(&(s_hi as i16).to_le_bytes());
        }
        o[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// Quantizes one activation row to Q8_0, Q8_1 or Q8_K: the reference bytes.
///
/// # Safety
/// The CPU must support AVX2 (the caller's target features).
#[inline(always)]
pub(crate) unsafe fn quantize_act(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    let (bs, size) = (ty.block_size(), ty.type_size());
    assert!(
        x.len().is_multiple_of(bs) && out.len() == x.len() / bs * size,
        "quantize_act: {} floats into {} bytes of {ty}",
        x.len(),
        out.len()
    );
    match ty {
        GgmlType::Q8_0 => q8_0(x, out),
        GgmlType::Q8_1 => q8_1(x, out),
        GgmlType::Q8_K => q8_k(x, out),
        other => quant::quantize_row(other, x, out).expect("lengths checked"),
    }
}
