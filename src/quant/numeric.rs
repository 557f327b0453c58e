//! The numeric primitives ggml's quantizers are built on (spec gguf-and-quants §2).

/// f32 → f16 bits, round to nearest even, NaN → 0x7E00 with the input's sign (ggml's software `f2h`).
pub fn f16_from_f32(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7E00 | (((x.to_bits() >> 16) as u16) & 0x8000);
    }
    half::f16::from_f32(x).to_bits()
}

/// f16 bits → f32, exact.
pub fn f32_from_f16(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// f32 → bf16 bits as ggml's reference: round to nearest even, NaN forced quiet.
pub fn bf16_from_f32(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 0x0040) as u16;
    }
    ((u.wrapping_add(0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// bf16 bits → f32, exact.
pub fn f32_from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// ggml's `nearest_int`: the 1.5·2^23 bit trick, i.e. round half to even on |x| < 2^22.
/// Implemented literally so out-of-range and NaN inputs behave as in ggml.
pub fn nearest_int(f: f32) -> i32 {
    let v = f + 12_582_912.0f32;
    let i = v.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_is_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(3.7), 4);
        assert_eq!(nearest_int(-3.7), -4);
    }

    #[test]
    fn f16_nan_and_rounding() {
        assert_eq!(f16_from_f32(f32::NAN), 0x7E00);
        assert_eq!(f16_from_f32(-f32::NAN), 0xFE00);
        assert_eq!(f16_from_f32(65520.0), 0x7C00);
        assert_eq!(f16_from_f32(1.0), 0x3C00);
        assert_eq!(f32_from_f16(0x3C00), 1.0);
    }

    #[test]
    fn bf16_reference() {
        assert_eq!(bf16_from_f32(1.0), 0x3F80);
        // 1 + 2^-8 is a tie: rounds to even (down).
        assert_eq!(bf16_from_f32(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(bf16_from_f32(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(bf16_from_f32(f32::from_bits(0x7F80_0001)), 0x7FC0);
        assert_eq!(f32_from_bf16(0x3F80), 1.0);
    }
}
