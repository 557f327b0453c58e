//! Type-erased entry points: rows of raw bytes in, floats out (and back), dispatched on [`GgmlType`].

use super::*;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("{ty}: {what}")]
    BadLength { ty: GgmlType, what: String },
    #[error("type {0} has no {1}")]
    Unsupported(GgmlType, &'static str),
    #[error("quantizing to {0} is not implemented yet")]
    NotImplemented(GgmlType),
    #[error("quantizing to {0} needs an importance matrix (--imatrix)")]
    NeedsImatrix(GgmlType),
}

fn bad(ty: GgmlType, what: String) -> QuantError {
    QuantError::BadLength { ty, what }
}

/// Views `bytes` as blocks of `B`, copying only when the slice is misaligned (never for mmap'd tensor data,
/// which GGUF aligns to 32 bytes).
fn blocks<B: BlockFormat>(bytes: &[u8]) -> Result<std::borrow::Cow<'_, [B]>, QuantError> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return Err(bad(
            B::TYPE,
            format!(
                "{} bytes is not a whole number of {size}-byte blocks",
                bytes.len()
            ),
        ));
    }
    match bytemuck::try_cast_slice::<u8, B>(bytes) {
        Ok(b) => Ok(std::borrow::Cow::Borrowed(b)),
        Err(_) => Ok(std::borrow::Cow::Owned(
            bytes
                .chunks_exact(size)
                .map(bytemuck::pod_read_unaligned)
                .collect(),
        )),
    }
}

fn dequant<B: BlockFormat>(src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let b = blocks::<B>(src)?;
    if b.len() * B::BLOCK != out.len() {
        return Err(bad(
            B::TYPE,
            format!("{} blocks cannot fill {} floats", b.len(), out.len()),
        ));
    }
    B::dequantize(&b, out);
    Ok(())
}

fn quant<B: BlockFormat>(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let size = std::mem::size_of::<B>();
    if !x.len().is_multiple_of(B::BLOCK) || out.len() != x.len() / B::BLOCK * size {
        return Err(bad(
            B::TYPE,
            format!(
                "{} floats cannot be quantized into {} bytes (block of {})",
                x.len(),
                out.len(),
                B::BLOCK
            ),
        ));
    }
    match bytemuck::try_cast_slice_mut::<u8, B>(out) {
        Ok(dst) => B::quantize(x, dst),
        Err(_) => {
            let mut tmp = vec![B::zeroed(); x.len() / B::BLOCK];
            B::quantize(x, &mut tmp);
            out.copy_from_slice(bytemuck::cast_slice(&tmp));
        }
    }
    Ok(())
}

fn dot<B: BlockFormat>(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    let wb = blocks::<B>(w)?;
    let ab = blocks::<B::VecDot>(a)?;
    if wb.len() * B::BLOCK != ab.len() * B::VecDot::BLOCK {
        return Err(bad(
            B::TYPE,
            format!(
                "row of {} elements dotted with {} activations",
                wb.len() * B::BLOCK,
                ab.len() * B::VecDot::BLOCK
            ),
        ));
    }
    Ok(B::vec_dot_ref(&wb, &ab))
}

macro_rules! dispatch {
    ($ty:expr, $f:ident, $what:literal, $($arg:expr),*) => {
        match $ty {
            GgmlType::F32 => $f::<F32>($($arg),*),
            GgmlType::F16 => $f::<F16>($($arg),*),
            GgmlType::BF16 => $f::<BF16>($($arg),*),
            GgmlType::Q4_0 => $f::<BlockQ4_0>($($arg),*),
            GgmlType::Q4_1 => $f::<BlockQ4_1>($($arg),*),
            GgmlType::Q5_0 => $f::<BlockQ5_0>($($arg),*),
            GgmlType::Q5_1 => $f::<BlockQ5_1>($($arg),*),
            GgmlType::Q8_0 => $f::<BlockQ8_0>($($arg),*),
            GgmlType::Q8_1 => $f::<BlockQ8_1>($($arg),*),
            GgmlType::Q2_K => $f::<BlockQ2K>($($arg),*),
            GgmlType::Q3_K => $f::<BlockQ3K>($($arg),*),
            GgmlType::Q4_K => $f::<BlockQ4K>($($arg),*),
            GgmlType::Q5_K => $f::<BlockQ5K>($($arg),*),
            GgmlType::Q6_K => $f::<BlockQ6K>($($arg),*),
            GgmlType::Q8_K => $f::<BlockQ8K>($($arg),*),
            GgmlType::IQ3_XXS => $f::<iq::BlockIQ3XXS>($($arg),*),
            GgmlType::IQ3_S => $f::<iq::BlockIQ3S>($($arg),*),
            GgmlType::IQ4_NL => $f::<iq::BlockIQ4NL>($($arg),*),
            GgmlType::IQ4_XS => $f::<iq::BlockIQ4XS>($($arg),*),
            GgmlType::TQ1_0 => $f::<iq::BlockTQ1_0>($($arg),*),
            GgmlType::TQ2_0 => $f::<iq::BlockTQ2_0>($($arg),*),
            GgmlType::MXFP4 => $f::<iq::BlockMXFP4>($($arg),*),
            GgmlType::IQ2_XXS => $f::<iq::BlockIQ2XXS>($($arg),*),
            GgmlType::IQ2_XS => $f::<iq::BlockIQ2XS>($($arg),*),
            GgmlType::IQ2_S => $f::<iq::BlockIQ2S>($($arg),*),
            GgmlType::IQ1_S => $f::<iq::BlockIQ1S>($($arg),*),
            GgmlType::IQ1_M => $f::<iq::BlockIQ1M>($($arg),*),
            other => Err(QuantError::Unsupported(other, $what)),
        }
    };
}

/// Dequantizes one or more whole rows of type `ty` from raw bytes into `out`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    dispatch!(ty, dequant, "dequantizer", src, out)
}

/// Quantizes `x` to type `ty` with the reference quantizer, writing raw blocks into `out`.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    dispatch!(ty, quant, "quantizer", x, out)
}

/// Scalar reference dot product of a weight row (`ty`) with activations already in `ty.vec_dot_type()`.
pub fn vec_dot_row(ty: GgmlType, w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    dispatch!(ty, dot, "dot product", w, a)
}

/// ggml's `ggml_quantize_requires_imatrix`: the types whose quantizer cannot run without importance weights.
pub fn quantize_requires_imatrix(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ1_S)
}

fn quant_imatrix<B: ImatrixQuantize>(
    x: &[f32],
    qw: Option<&[f32]>,
    out: &mut [u8],
) -> Result<(), QuantError> {
    let size = std::mem::size_of::<B>();
    if !x.len().is_multiple_of(B::BLOCK) || out.len() != x.len() / B::BLOCK * size {
        return Err(bad(
            B::TYPE,
            format!(
                "{} floats cannot be quantized into {} bytes (block of {})",
                x.len(),
                out.len(),
                B::BLOCK
            ),
        ));
    }
    if let Some(w) = qw.filter(|w| w.len() != x.len()) {
        return Err(bad(
            B::TYPE,
            format!("{} importance weights for a row of {}", w.len(), x.len()),
        ));
    }
    match bytemuck::try_cast_slice_mut::<u8, B>(out) {
        Ok(dst) => B::quantize_row_imatrix(x, qw, dst),
        Err(_) => {
            let mut tmp = vec![B::zeroed(); x.len() / B::BLOCK];
            B::quantize_row_imatrix(x, qw, &mut tmp);
            out.copy_from_slice(bytemuck::cast_slice(&tmp));
        }
    }
    Ok(())
}

/// Quantizes exactly one row `x` to `ty` as llama-quantize does (`ggml_quantize_chunk`), with the row's
/// importance weights `qw` (one per column) when given. Some formats use statistics of the whole row, so
/// `x` must be one row, not several. Float types ignore the weights.
pub fn quantize_row_imatrix(
    ty: GgmlType,
    x: &[f32],
    qw: Option<&[f32]>,
    out: &mut [u8],
) -> Result<(), QuantError> {
    if qw.is_none() && quantize_requires_imatrix(ty) {
        return Err(QuantError::NeedsImatrix(ty));
    }
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => quantize_row(ty, x, out),
        GgmlType::Q4_0 => quant_imatrix::<BlockQ4_0>(x, qw, out),
        GgmlType::Q4_1 => quant_imatrix::<BlockQ4_1>(x, qw, out),
        GgmlType::Q5_0 => quant_imatrix::<BlockQ5_0>(x, qw, out),
        GgmlType::Q5_1 => quant_imatrix::<BlockQ5_1>(x, qw, out),
        GgmlType::Q8_0 => quant_imatrix::<BlockQ8_0>(x, qw, out),
        GgmlType::Q2_K => quant_imatrix::<BlockQ2K>(x, qw, out),
        GgmlType::Q3_K => quant_imatrix::<BlockQ3K>(x, qw, out),
        GgmlType::Q4_K => quant_imatrix::<BlockQ4K>(x, qw, out),
        GgmlType::Q5_K => quant_imatrix::<BlockQ5K>(x, qw, out),
        GgmlType::Q6_K => quant_imatrix::<BlockQ6K>(x, qw, out),
        GgmlType::IQ3_XXS => quant_imatrix::<iq::BlockIQ3XXS>(x, qw, out),
        GgmlType::IQ3_S => quant_imatrix::<iq::BlockIQ3S>(x, qw, out),
        GgmlType::IQ4_NL => quant_imatrix::<iq::BlockIQ4NL>(x, qw, out),
        GgmlType::IQ4_XS => quant_imatrix::<iq::BlockIQ4XS>(x, qw, out),
        GgmlType::IQ2_XXS => quant_imatrix::<iq::BlockIQ2XXS>(x, qw, out),
        GgmlType::IQ2_XS => quant_imatrix::<iq::BlockIQ2XS>(x, qw, out),
        GgmlType::IQ2_S => quant_imatrix::<iq::BlockIQ2S>(x, qw, out),
        GgmlType::IQ1_S => quant_imatrix::<iq::BlockIQ1S>(x, qw, out),
        GgmlType::IQ1_M => quant_imatrix::<iq::BlockIQ1M>(x, qw, out),
        // ggml's quantizers of these take no importance weights: the reference quantizer.
        GgmlType::TQ1_0 | GgmlType::TQ2_0 | GgmlType::MXFP4 => quantize_row(ty, x, out),
        other => Err(QuantError::Unsupported(other, "quantizer")),
    }
}

#[cfg(test)]
mod imatrix_tests {
    use super::*;

    fn row(n: usize, offset: f32) -> Vec<f32> {
        (0..n)
            .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos() * (1.0 + (i % 7) as f32))
            .collect()
    }

    /// The legacy and K formats (those whose weightless path is their reference quantizer; IQ4_NL's
    /// llama-quantize path tries more scales than its reference, IQ3_XXS needs weights).
    const TYPES: [GgmlType; 10] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    #[test]
    fn without_weights_equals_the_reference_quantizer() {
        for ty in TYPES {
            for offset in [0.0, 1.0, 0.37] {
                let x = row(1024, offset);
                let n = ty.row_bytes(1024).unwrap() as usize;
                let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
                quantize_row(ty, &x, &mut a).unwrap();
                quantize_row_imatrix(ty, &x, None, &mut b).unwrap();
                assert_eq!(a, b, "{ty}");
            }
        }
    }

    #[test]
    fn weighted_quantizers_round_trip() {
        // Weights change the bytes (Q8_0 excepted) but not the quality class of the result.
        for ty in TYPES {
            let x = row(512, 0.5);
            let w: Vec<f32> = (0..512).map(|i| 0.5 + (i % 13) as f32).collect();
            let n = ty.row_bytes(512).unwrap() as usize;
            let (mut plain, mut weighted) = (vec![0u8; n], vec![0u8; n]);
            quantize_row(ty, &x, &mut plain).unwrap();
            quantize_row_imatrix(ty, &x, Some(&w), &mut weighted).unwrap();
            assert_eq!(plain == weighted, ty == GgmlType::Q8_0, "{ty}");
            let mut y = vec![0f32; 512];
            dequantize_row(ty, &weighted, &mut y).unwrap();
            let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).sum::<f32>() / 512.0;
            let scale: f32 = x.iter().map(|a| a.abs()).sum::<f32>() / 512.0;
            // (2-bit Q2_K on this fast-oscillating row: about 0.26.)
            let limit = if ty == GgmlType::Q2_K { 0.4 } else { 0.25 };
            assert!(
                err < limit * scale,
                "{ty}: mean error {err} for mean |x| {scale}"
            );
        }
    }

    #[test]
    fn zero_rows_and_bad_lengths() {
        for ty in TYPES {
            let n = ty.row_bytes(256).unwrap() as usize;
            let mut out = vec![0xAAu8; n];
            quantize_row_imatrix(ty, &[0.0; 256], Some(&[1.0; 256]), &mut out).unwrap();
            let mut y = vec![1f32; 256];
            dequantize_row(ty, &out, &mut y).unwrap();
            assert!(y.iter().all(|&v| v == 0.0), "{ty}");
            assert!(quantize_row_imatrix(ty, &[0.0; 256], Some(&[1.0; 255]), &mut out).is_err());
            assert!(quantize_row_imatrix(ty, &[0.0; 256], None, &mut out[1..]).is_err());
        }
    }

    #[test]
    fn low_bit_iq_types_need_weights() {
        let mut out = vec![0u8; 1024];
        assert_eq!(
            quantize_row_imatrix(GgmlType::IQ2_XXS, &[0.0; 256], None, &mut out[..66]),
            Err(QuantError::NeedsImatrix(GgmlType::IQ2_XXS))
        );
        // ggml quantizes IQ3_XXS without weights (llama-quantize's refusal is a per-tensor rule).
        assert!(quantize_row_imatrix(GgmlType::IQ3_XXS, &[0.0; 256], None, &mut out[..98]).is_ok());
        assert!(quantize_row_imatrix(GgmlType::IQ4_NL, &[0.0; 32], None, &mut out[..18]).is_ok());
    }
}
