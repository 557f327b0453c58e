//! Unquantized element types: F32, F16, BF16 (a "block" of one element).
//!
//! Quantization is ggml's reference conversion (software `f2h` for F16, round-to-nearest-even with quiet NaN for
//! BF16), dequantization is exact. The dot product follows ggml's scalar `ggml_vec_dot_{f32,f16,bf16}`: each product
//! is formed in f32, widened to f64 (`ggml_float`) and summed sequentially, and the sum is rounded to f32 once at
//! the end. (ggml's SIMD paths sum in f32 lanes instead; this is the reference they are held to.)
use super::*;

/// Σ x·y with ggml's scalar semantics: f32 products, f64 sequential sum, one final rounding.
fn dot_f64(pairs: impl Iterator<Item = (f32, f32)>) -> f32 {
    pairs.fold(0.0f64, |sum, (x, y)| sum + (x * y) as f64) as f32
}

macro_rules! scalar_format {
    ($(#[$doc:meta])* $name:ident($inner:ty), $ty:ident, $to_f32:expr, $from_f32:expr) => {
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name(pub $inner);

        impl $name {
            pub fn to_f32(self) -> f32 {
                ($to_f32)(self.0)
            }
        }

        impl BlockFormat for $name {
            const TYPE: GgmlType = GgmlType::$ty;
            const BLOCK: usize = 1;
            type VecDot = Self;

            fn quantize(x: &[f32], out: &mut [Self]) {
                assert_eq!(x.len(), out.len(), "{}: length mismatch", Self::TYPE);
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = $name(($from_f32)(v));
                }
            }

            fn dequantize(blocks: &[Self], out: &mut [f32]) {
                assert_eq!(blocks.len(), out.len(), "{}: length mismatch", Self::TYPE);
                for (o, b) in out.iter_mut().zip(blocks) {
                    *o = b.to_f32();
                }
            }

            fn vec_dot_ref(w: &[Self], a: &[Self]) -> f32 {
                assert_eq!(w.len(), a.len(), "{}: length mismatch", Self::TYPE);
                dot_f64(w.iter().zip(a).map(|(x, y)| (x.to_f32(), y.to_f32())))
            }
        }
    };
}

scalar_format!(
    /// An f32 element.
    F32(f32), F32, |v: f32| v, |v: f32| v
);
scalar_format!(
    /// An IEEE binary16 element, stored as its bits.
    F16(u16), F16, f32_from_f16, f16_from_f32
);
scalar_format!(
    /// A bfloat16 element (upper half of an f32), stored as its bits.
    BF16(u16), BF16, f32_from_bf16, bf16_from_f32
);

#[cfg(test)]
mod tests {
    use super::*;

    fn quantize<B: BlockFormat>(x: &[f32]) -> Vec<B> {
        let mut out = vec![B::zeroed(); x.len()];
        B::quantize(x, &mut out);
        out
    }

    fn bits16<B: BlockFormat>(x: f32) -> u16 {
        let b = quantize::<B>(&[x]);
        u16::from_le_bytes(bytemuck::cast_slice::<B, u8>(&b).try_into().unwrap())
    }

    fn cos_data(offset: f32) -> Vec<f32> {
        (0..4096)
            .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
            .collect()
    }

    #[test]
    fn f16_rounds_ties_to_even() {
        // 1 + 2^-11 lies halfway between 1.0 and the next f16 (1 + 2^-10): even mantissa wins.
        assert_eq!(bits16::<F16>(1.0 + f32::powi(2.0, -11)), 0x3C00);
        assert_eq!(bits16::<F16>(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3C02);
        assert_eq!(bits16::<F16>(-(1.0 + 3.0 * f32::powi(2.0, -11))), 0xBC02);
        // Just above the tie rounds up.
        assert_eq!(bits16::<F16>(f32::from_bits(0x3F80_1001)), 0x3C01);
        // Subnormal ties: 2^-25 is half the smallest subnormal (rounds to 0), 3·2^-25 rounds to 2 units.
        assert_eq!(bits16::<F16>(f32::powi(2.0, -25)), 0x0000);
        assert_eq!(bits16::<F16>(3.0 * f32::powi(2.0, -25)), 0x0002);
        // Overflow to infinity at 65520 (the tie between 65504 and 2^16).
        assert_eq!(bits16::<F16>(65519.0), 0x7BFF);
        assert_eq!(bits16::<F16>(65520.0), 0x7C00);
        assert_eq!(bits16::<F16>(f32::NAN), 0x7E00);
    }

    #[test]
    fn bf16_rounds_ties_to_even() {
        assert_eq!(bits16::<BF16>(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(bits16::<BF16>(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(bits16::<BF16>(f32::from_bits(0xBF81_8000)), 0xBF82);
        assert_eq!(bits16::<BF16>(f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(bits16::<BF16>(f32::from_bits(0x3F80_7FFF)), 0x3F80);
        // Subnormals are kept; the largest finite value rounds to infinity.
        assert_eq!(bits16::<BF16>(f32::from_bits(0x0000_8001)), 0x0001);
        assert_eq!(bits16::<BF16>(f32::MAX), 0x7F80);
        // NaN is forced quiet.
        assert_eq!(bits16::<BF16>(f32::from_bits(0x7F80_0001)), 0x7FC0);
    }

    #[test]
    fn dequantize_is_exact() {
        let mut out = [0.0f32; 4];
        F16::dequantize(
            &[F16(0x3C00), F16(0xC000), F16(0x0001), F16(0x7BFF)],
            &mut out,
        );
        assert_eq!(out, [1.0, -2.0, f32::powi(2.0, -24), 65504.0]);
        BF16::dequantize(
            &[BF16(0x3F80), BF16(0xC040), BF16(0x0001), BF16(0x7F7F)],
            &mut out,
        );
        assert_eq!(
            out,
            [
                1.0,
                -3.0,
                f32::from_bits(0x0001_0000),
                f32::from_bits(0x7F7F_0000)
            ]
        );
        let x = [1.5f32, -0.0, f32::MIN_POSITIVE, 3.0e38];
        F32::dequantize(&quantize::<F32>(&x), &mut out);
        assert_eq!(out.map(f32::to_bits), x.map(f32::to_bits));
    }

    #[test]
    fn round_trip_error_is_small() {
        fn err<B: BlockFormat>(x: &[f32]) -> f64 {
            let mut y = vec![0.0f32; x.len()];
            B::dequantize(&quantize::<B>(x), &mut y);
            let sum: f64 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                .sum();
            sum.sqrt() / x.len() as f64
        }
        for offset in [0.0, 1.0] {
            let x = cos_data(offset);
            assert_eq!(err::<F32>(&x), 0.0);
            // f16 keeps 11 significant bits, bf16 8: relative errors ≈ 2^-12 and 2^-9 per element.
            assert!(err::<F16>(&x) < 1e-5, "F16 {}", err::<F16>(&x));
            assert!(err::<BF16>(&x) < 1e-4, "BF16 {}", err::<BF16>(&x));
            assert!(err::<BF16>(&x) > 0.0);
        }
    }

    #[test]
    fn dot_sums_in_f64() {
        // An f32 running sum would lose the 1.0 next to 1e8 and return 0.
        let w = quantize::<F32>(&[1.0e8, 1.0, -1.0e8]);
        let a = quantize::<F32>(&[1.0, 1.0, 1.0]);
        assert_eq!(F32::vec_dot_ref(&w, &a), 1.0);
        // Products are rounded to f32 before widening: (1 + 2^-12)² = 1 + 2^-11 + 2^-24 is a tie in f32 and
        // rounds to 1 + 2^-11, so the f64 sum of v·v − 1 is exactly 2^-11 (an f64 product would keep 2^-24).
        let v = 1.0 + f32::powi(2.0, -12);
        let (w, a) = (quantize::<F32>(&[v, 1.0]), quantize::<F32>(&[v, -1.0]));
        assert_eq!(F32::vec_dot_ref(&w, &a), f32::powi(2.0, -11));
        let t = f32::powi(2.0, 12);
        let (w, a) = (
            quantize::<BF16>(&[t, 1.0, -t]),
            quantize::<BF16>(&[t, 1.0, t]),
        );
        assert_eq!(BF16::vec_dot_ref(&w, &a), 1.0);
        let (w, a) = (
            quantize::<F16>(&[32768.0, 0.5, -32768.0]),
            quantize::<F16>(&[32768.0, 0.5, 32768.0]),
        );
        assert_eq!(F16::vec_dot_ref(&w, &a), 0.25);
    }

    #[test]
    fn dot_matches_f64_reference() {
        let (x, y) = (cos_data(0.0), cos_data(1.0));
        let exact: f64 = x.iter().zip(&y).map(|(a, b)| *a as f64 * *b as f64).sum();
        fn check<B: BlockFormat<VecDot = B>>(x: &[f32], y: &[f32], exact: f64) {
            let (w, a) = (quantize::<B>(x), quantize::<B>(y));
            let (mut xd, mut yd) = (vec![0.0; x.len()], vec![0.0; y.len()]);
            B::dequantize(&w, &mut xd);
            B::dequantize(&a, &mut yd);
            let same: f64 = xd.iter().zip(&yd).map(|(a, b)| *a as f64 * *b as f64).sum();
            let got = B::vec_dot_ref(&w, &a) as f64;
            assert!(
                (got - same).abs() <= 1e-6 * same.abs().max(1.0),
                "{}",
                B::TYPE
            );
            assert!((got - exact).abs() / (x.len() as f64) < 0.02, "{}", B::TYPE);
        }
        check::<F32>(&x, &y, exact);
        check::<F16>(&x, &y, exact);
        check::<BF16>(&x, &y, exact);
    }
}
