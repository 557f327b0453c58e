//! Type-erased entry points: rows of raw bytes in, floats out (and back), dispatched on [`GgmlType`].

use super::*;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("{ty}: {what}")]
    BadLength { ty: GgmlType, what: String },
    #[error("type {0} has no {1}")]
    Unsupported(GgmlType, &'static str),
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
