//! ggml block formats: one `#[repr(C)]` type per format, all implementing [`BlockFormat`].
//!
//! Every format has an exact dequantizer, the reference quantizer that `llama-quantize` uses without an
//! importance matrix (bit-exact with ggml), and a scalar reference dot product against its activation
//! partner (`VecDot`). SIMD kernels (later, in `src/kernels/`) are held to these references.

mod float;
pub mod iq;
mod kquants;
mod legacy;
mod numeric;
mod row;

pub use float::{BF16, F16, F32};
pub use kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
pub use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
pub use numeric::{bf16_from_f32, f16_from_f32, f32_from_bf16, f32_from_f16, nearest_int};
pub use row::{
    dequantize_row, quantize_requires_imatrix, quantize_row, quantize_row_imatrix, vec_dot_row,
    QuantError,
};

/// Elements in a K-quant super-block.
pub const QK_K: usize = 256;

/// A ggml tensor type id as stored in GGUF tensor infos (`ggml_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
    // The IQ, ternary and newer formats (src/quant/iq): `has_blocks` says which this crate computes with.
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    IQ1_M,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

impl GgmlType {
    /// Every type this crate knows, in id order.
    pub const ALL: [GgmlType; 34] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::BF16,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::IQ1_M,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
    ];

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::I8 => 24,
            GgmlType::I16 => 25,
            GgmlType::I32 => 26,
            GgmlType::I64 => 27,
            GgmlType::F64 => 28,
            GgmlType::BF16 => 30,
            GgmlType::IQ2_XXS => 16,
            GgmlType::IQ2_XS => 17,
            GgmlType::IQ3_XXS => 18,
            GgmlType::IQ1_S => 19,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ3_S => 21,
            GgmlType::IQ2_S => 22,
            GgmlType::IQ4_XS => 23,
            GgmlType::IQ1_M => 29,
            GgmlType::TQ1_0 => 34,
            GgmlType::TQ2_0 => 35,
            GgmlType::MXFP4 => 39,
            GgmlType::NVFP4 => 40,
            GgmlType::Q1_0 => 41,
        }
    }

    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The name ggml and gguf-dump print ("Q4_K", "F32", ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
            GgmlType::I8 => "I8",
            GgmlType::I16 => "I16",
            GgmlType::I32 => "I32",
            GgmlType::I64 => "I64",
            GgmlType::F64 => "F64",
            GgmlType::BF16 => "BF16",
            GgmlType::IQ2_XXS => "IQ2_XXS",
            GgmlType::IQ2_XS => "IQ2_XS",
            GgmlType::IQ3_XXS => "IQ3_XXS",
            GgmlType::IQ1_S => "IQ1_S",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ3_S => "IQ3_S",
            GgmlType::IQ2_S => "IQ2_S",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::IQ1_M => "IQ1_M",
            GgmlType::TQ1_0 => "TQ1_0",
            GgmlType::TQ2_0 => "TQ2_0",
            GgmlType::MXFP4 => "MXFP4",
            GgmlType::NVFP4 => "NVFP4",
            GgmlType::Q1_0 => "Q1_0",
        }
    }

    /// The block-quantized weight formats (those with a dot product against a Q8 activation format).
    pub const WEIGHT_QUANTS: [GgmlType; 22] = [
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
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
    ];

    /// Parses a type name, case-insensitively ("q4_k", "Q8_0", "bf16").
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1 => 32,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K => QK_K,
            GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ3_XXS
            | GgmlType::IQ1_S
            | GgmlType::IQ3_S
            | GgmlType::IQ2_S
            | GgmlType::IQ4_XS
            | GgmlType::IQ1_M
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0 => 256,
            GgmlType::IQ4_NL | GgmlType::MXFP4 => 32,
            GgmlType::NVFP4 => 64,
            GgmlType::Q1_0 => 128,
            _ => 1,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::I32 => 4,
            GgmlType::F16 | GgmlType::BF16 | GgmlType::I16 => 2,
            GgmlType::I8 => 1,
            GgmlType::I64 | GgmlType::F64 => 8,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q8_K => 292,
            GgmlType::IQ2_XXS => 66,
            GgmlType::IQ2_XS => 74,
            GgmlType::IQ3_XXS => 98,
            GgmlType::IQ1_S => 50,
            GgmlType::IQ4_NL => 18,
            GgmlType::IQ3_S => 110,
            GgmlType::IQ2_S => 82,
            GgmlType::IQ4_XS => 136,
            GgmlType::IQ1_M => 56,
            GgmlType::TQ1_0 => 54,
            GgmlType::TQ2_0 => 66,
            GgmlType::MXFP4 => 17,
            GgmlType::NVFP4 => 36,
            GgmlType::Q1_0 => 18,
        }
    }

    /// Bytes of one row of `n` elements, or `None` if `n` is not a whole number of blocks or overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }

    /// True for the types with a dequantizer here (floats and the implemented block formats).
    pub fn can_dequantize(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) || self.has_blocks()
    }

    /// True for the block formats this crate implements (`BlockFormat` types).
    fn has_blocks(self) -> bool {
        matches!(
            self,
            GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::Q8_1
                | GgmlType::Q2_K
                | GgmlType::Q3_K
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
                | GgmlType::Q8_K
                | GgmlType::IQ3_XXS
                | GgmlType::IQ3_S
                | GgmlType::IQ4_NL
                | GgmlType::IQ4_XS
                | GgmlType::TQ1_0
                | GgmlType::TQ2_0
                | GgmlType::MXFP4
                | GgmlType::IQ2_XXS
                | GgmlType::IQ2_XS
                | GgmlType::IQ2_S
                | GgmlType::IQ1_S
                | GgmlType::IQ1_M
        )
    }

    /// True for the block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// The activation format a weight row of this type is dotted with (`vec_dot_type` in ggml).
    pub fn vec_dot_type(self) -> GgmlType {
        match self {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => GgmlType::Q8_0,
            GgmlType::Q4_1 | GgmlType::Q5_1 => GgmlType::Q8_1,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K
            | GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ3_XXS
            | GgmlType::IQ3_S
            | GgmlType::IQ1_S
            | GgmlType::IQ1_M
            | GgmlType::IQ4_XS
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0 => GgmlType::Q8_K,
            GgmlType::IQ4_NL | GgmlType::MXFP4 => GgmlType::Q8_0,
            other => other,
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One block of a ggml format: `BLOCK` elements stored in `size_of::<Self>()` bytes.
///
/// `quantize` is the reference quantizer (`quantize_row_*_ref` in ggml), bit-exact with `llama-quantize`
/// without an importance matrix; `dequantize` is exact (`dequantize_row_*`); `vec_dot_ref` is the scalar
/// reference dot product of weight blocks with activation blocks of the partner type.
pub trait BlockFormat: bytemuck::Pod + Send + Sync {
    const TYPE: GgmlType;
    /// Elements per block.
    const BLOCK: usize;
    /// The activation format this weight format is dotted with.
    type VecDot: BlockFormat;

    /// Quantizes `x` (`x.len() == out.len() * BLOCK`) block by block.
    fn quantize(x: &[f32], out: &mut [Self]);

    /// Dequantizes `blocks` into `out` (`out.len() == blocks.len() * BLOCK`).
    fn dequantize(blocks: &[Self], out: &mut [f32]);

    /// Σ w·a over one row, with `a` the activations already quantized to `Self::VecDot`.
    fn vec_dot_ref(w: &[Self], a: &[Self::VecDot]) -> f32;
}

/// llama-quantize's row quantizer for a format (`quantize_<type>` in ggml): with an importance matrix
/// `qw` (one weight per column of the row, `in_sum2 / count` as llama-quantize loads it), or without one.
///
/// Without `qw` it equals [`BlockFormat::quantize`] for the legacy and K formats; IQ4_NL's llama-quantize
/// path tries more scales than its reference quantizer, so the two differ there.
/// The result depends on the row only (rows are independent), so callers may split a tensor by rows.
pub trait ImatrixQuantize: BlockFormat {
    /// True for the formats llama-quantize refuses to make without an importance matrix.
    const NEEDS_IMATRIX: bool = false;

    /// Quantizes one row `x` (`x.len() == out.len() * BLOCK`, `qw.len() == x.len()` when given).
    fn quantize_row_imatrix(x: &[f32], qw: Option<&[f32]>, out: &mut [Self]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_ggml() {
        use std::mem::size_of;
        assert_eq!(size_of::<BlockQ4_0>(), 18);
        assert_eq!(size_of::<BlockQ4_1>(), 20);
        assert_eq!(size_of::<BlockQ5_0>(), 22);
        assert_eq!(size_of::<BlockQ5_1>(), 24);
        assert_eq!(size_of::<BlockQ8_0>(), 34);
        assert_eq!(size_of::<BlockQ8_1>(), 36);
        assert_eq!(size_of::<BlockQ2K>(), 84);
        assert_eq!(size_of::<BlockQ3K>(), 110);
        assert_eq!(size_of::<BlockQ4K>(), 144);
        assert_eq!(size_of::<BlockQ5K>(), 176);
        assert_eq!(size_of::<BlockQ6K>(), 210);
        assert_eq!(size_of::<BlockQ8K>(), 292);
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
    }
}
