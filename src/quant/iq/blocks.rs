//! Block layouts of the IQ, ternary and MXFP4 formats (ggml-common.h). Scales are f16 bits (`u16`).
//!
//! Only the layouts live here; each format's dequantizer, quantizer and dot product live in the
//! format's own module.

use crate::quant::QK_K;

/// 256 values: 32 groups of 8, each `qs` pair of u16 holding 4 grid indices (8 bits each) and 4×7 sign
/// bits plus a 4-bit group scale. 66 bytes, 2.06 bpw.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ2XXS {
    pub d: u16,
    pub qs: [u16; QK_K / 8],
}

/// 256 values: each u16 holds a 9-bit grid index and 7 sign bits; 4-bit scales per 16 values. 74 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ2XS {
    pub d: u16,
    pub qs: [u16; QK_K / 8],
    pub scales: [u8; QK_K / 32],
}

/// 256 values: 10-bit grid indices (low 8 bits in `qs[0..32]`, high 2 in `qh`), explicit sign bytes in
/// `qs[32..64]`, 4-bit scales per 16 values. 82 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ2S {
    pub d: u16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}

/// 256 values: 64 grid indices of 4 values (`qs[0..64]`), then per 32 values a u32 of 4×7 sign bits and a
/// 4-bit scale (`qs[64..96]`). 98 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ3XXS {
    pub d: u16,
    pub qs: [u8; 3 * QK_K / 8],
}

/// 256 values: 9-bit grid indices of 4 values (low 8 in `qs`, high bit in `qh`), sign bits, 4-bit scales
/// per 32 values. 110 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ3S {
    pub d: u16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}

/// 256 values: 11-bit indices into the ternary grid (low 8 in `qs`, high 3 in `qh`), per 32 values a 3-bit
/// scale and the sign of the ±delta shift in `qh`. 50 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ1S {
    pub d: u16,
    pub qs: [u8; QK_K / 8],
    pub qh: [u16; QK_K / 32],
}

/// 256 values: like IQ1_S with a shift sign per 8 values and 3-bit scales per 16 values; the f16 super
/// scale is spread over the top nibbles of `scales`. 56 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}

/// Elements of an IQ4_NL block.
pub const QK4_NL: usize = 32;

/// 32 values: `d · KVALUES_IQ4NL[q]`, 4-bit q (element `l` low nibble, `l + 16` high nibble). 18 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ4NL {
    pub d: u16,
    pub qs: [u8; QK4_NL / 2],
}

/// 256 values: IQ4_NL levels with a 6-bit scale per 32 values (low 4 bits in `scales_l`, high 2 in
/// `scales_h`). 136 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ4XS {
    pub d: u16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

/// 256 ternary values {-1, 0, 1}·d, five per byte in base 3 (`qs`) and four per byte in `qh`. 54 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTQ1_0 {
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    pub qh: [u8; QK_K / 64],
    pub d: u16,
}

/// 256 ternary values, 2 bits each (`q - 1`). 66 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTQ2_0 {
    pub qs: [u8; QK_K / 4],
    pub d: u16,
}

/// Elements of an MXFP4 block.
pub const QK_MXFP4: usize = 32;

/// 32 FP4 (E2M1) values with a shared E8M0 exponent `e`. 17 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockMXFP4 {
    pub e: u8,
    pub qs: [u8; QK_MXFP4 / 2],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;
    use std::mem::size_of;

    #[test]
    fn sizes_match_ggml() {
        let cases = [
            (size_of::<BlockIQ2XXS>(), GgmlType::IQ2_XXS),
            (size_of::<BlockIQ2XS>(), GgmlType::IQ2_XS),
            (size_of::<BlockIQ2S>(), GgmlType::IQ2_S),
            (size_of::<BlockIQ3XXS>(), GgmlType::IQ3_XXS),
            (size_of::<BlockIQ3S>(), GgmlType::IQ3_S),
            (size_of::<BlockIQ1S>(), GgmlType::IQ1_S),
            (size_of::<BlockIQ1M>(), GgmlType::IQ1_M),
            (size_of::<BlockIQ4NL>(), GgmlType::IQ4_NL),
            (size_of::<BlockIQ4XS>(), GgmlType::IQ4_XS),
            (size_of::<BlockTQ1_0>(), GgmlType::TQ1_0),
            (size_of::<BlockTQ2_0>(), GgmlType::TQ2_0),
            (size_of::<BlockMXFP4>(), GgmlType::MXFP4),
        ];
        for (size, ty) in cases {
            assert_eq!(size, ty.type_size(), "{ty}");
        }
    }
}
