//! AArch64 kernels: plain NEON (every ARMv8-A core, e.g. Raspberry Pi 3/4) and NEON with the dot-product
//! extension (`sdot`, Cortex-A55/A76 and later, e.g. Raspberry Pi 5).
//!
//! Both tables share the float kernels and the activation quantizers; they differ in the integer dot
//! product of the quantized kernels ([`neon::Smull`] or [`neon::Sdot`]). The dotprod table is only handed
//! out when the CPU reports the feature.

mod attend;
mod float;
mod iq1;
mod iq2;
mod iq3;
mod iq4;
mod iqgrid;
mod kgemm;
mod kquants;
mod legacy;
mod neon;
mod ops;
mod quantize;
#[cfg(test)]
mod tests;

use super::dispatch::{GemmOut, Isa, Kernels, QuantGemm};
use crate::quant::GgmlType;
use neon::{Dot, Sdot, Smull};

/// Plain NEON: `smull` + `sadalp` integer dot products.
pub static NEON: Kernels = Kernels {
    isa: Isa::Neon,
    quant_rows: quant_rows_neon,
    quant_gemm: None,
    float_rows: float::float_rows,
    quantize_act: quantize::quantize_act,
    attend_f32: attend::entry::<f32>,
    attend_f16: attend::entry::<half::f16>,
    attend_many_f32: attend::entry_many::<f32>,
    attend_many_f16: attend::entry_many::<half::f16>,
    attend_steps: attend::STEPS,
    ops: ops::OPS,
};

/// NEON with FEAT_DotProd: `sdot` integer dot products, and a prefill GEMM for the K-quants
/// ([`kgemm`], `sdot` by element: 4 rows × 4 codes per vector).
pub static NEON_DOTPROD: Kernels = Kernels {
    isa: Isa::NeonDotprod,
    quant_rows: quant_rows_dotprod,
    quant_gemm: Some(QuantGemm {
        supports: gemm_supports,
        run: quant_gemm_dotprod,
        run_quants: None,
    }),
    float_rows: float::float_rows,
    quantize_act: quantize::quantize_act,
    attend_f32: attend::entry::<f32>,
    attend_f16: attend::entry::<half::f16>,
    attend_many_f32: attend::entry_many::<f32>,
    attend_many_f16: attend::entry_many::<half::f16>,
    attend_steps: attend::STEPS,
    ops: ops::OPS,
};

/// The tables this CPU runs, lowest first.
pub fn tables() -> Vec<&'static Kernels> {
    let mut v = vec![&NEON];
    if has_dotprod() {
        v.push(&NEON_DOTPROD);
    }
    v
}

fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// Every quantized weight type, through the row driver with dot product flavour `D`.
///
/// # Safety
/// The CPU must support `D`'s instructions.
#[inline(always)]
unsafe fn quant_rows_with<D: Dot>(ty: GgmlType, w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
    use neon::quant_rows as run;
    match ty {
        GgmlType::Q4_0 => run::<legacy::Q4_0, D>(w, a, n_tok, out),
        GgmlType::Q4_1 => run::<legacy::Q4_1, D>(w, a, n_tok, out),
        GgmlType::Q5_0 => run::<legacy::Q5_0, D>(w, a, n_tok, out),
        GgmlType::Q5_1 => run::<legacy::Q5_1, D>(w, a, n_tok, out),
        GgmlType::Q8_0 => run::<legacy::Q8_0, D>(w, a, n_tok, out),
        GgmlType::Q2_K => run::<kquants::Q2K, D>(w, a, n_tok, out),
        GgmlType::Q3_K => run::<kquants::Q3K, D>(w, a, n_tok, out),
        GgmlType::Q4_K => run::<kquants::Q4K, D>(w, a, n_tok, out),
        GgmlType::Q5_K => run::<kquants::Q5K, D>(w, a, n_tok, out),
        GgmlType::Q6_K => run::<kquants::Q6K, D>(w, a, n_tok, out),
        GgmlType::IQ4_NL => run::<iq4::IQ4NL, D>(w, a, n_tok, out),
        GgmlType::IQ4_XS => run::<iq4::IQ4XS, D>(w, a, n_tok, out),
        GgmlType::IQ3_XXS => run::<iq3::IQ3XXS, D>(w, a, n_tok, out),
        GgmlType::IQ3_S => run::<iq3::IQ3S, D>(w, a, n_tok, out),
        GgmlType::IQ2_XXS => run::<iq2::IQ2XXS, D>(w, a, n_tok, out),
        GgmlType::IQ2_XS => run::<iq2::IQ2XS, D>(w, a, n_tok, out),
        GgmlType::IQ2_S => run::<iq2::IQ2S, D>(w, a, n_tok, out),
        GgmlType::IQ1_S => run::<iq1::IQ1S, D>(w, a, n_tok, out),
        GgmlType::IQ1_M => run::<iq1::IQ1M, D>(w, a, n_tok, out),
        // Formats without a NEON kernel (TQ1_0, TQ2_0, MXFP4; Q8_1/Q8_K as weights): the scalar
        // reference.
        _ => super::scalar::quant_rows(ty, w, a, n_tok, out),
    }
}

fn quant_rows_neon(ty: GgmlType, w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
    // SAFETY: `Smull` uses only baseline NEON, which every aarch64 CPU has.
    unsafe { quant_rows_with::<Smull>(ty, w, a, n_tok, out) }
}

#[target_feature(enable = "dotprod")]
unsafe fn quant_rows_sdot(ty: GgmlType, w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
    quant_rows_with::<Sdot>(ty, w, a, n_tok, out)
}

fn quant_rows_dotprod(ty: GgmlType, w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
    if has_dotprod() {
        // SAFETY: the CPU has FEAT_DotProd (checked just above; the check is a cached load), which is
        // all `quant_rows_sdot` and the `sdot` instructions inlined into it require.
        unsafe { quant_rows_sdot(ty, w, a, n_tok, out) }
    } else {
        // Only reachable by calling the table directly on a CPU without dotprod: stay correct.
        quant_rows_neon(ty, w, a, n_tok, out)
    }
}

/// The weight types of the dot-product table's prefill GEMM.
fn gemm_supports(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K
    )
}

#[target_feature(enable = "dotprod")]
unsafe fn quant_gemm_sdot(ty: GgmlType, w: &[u8], a: &[u8], out: GemmOut<'_>) {
    match ty {
        GgmlType::Q2_K => kgemm::gemm::<kquants::Q2K>(w, a, out),
        GgmlType::Q3_K => kgemm::gemm::<kquants::Q3K>(w, a, out),
        GgmlType::Q4_K => kgemm::gemm::<kquants::Q4K>(w, a, out),
        GgmlType::Q5_K => kgemm::gemm::<kquants::Q5K>(w, a, out),
        GgmlType::Q6_K => kgemm::gemm::<kquants::Q6K>(w, a, out),
        other => panic!("quant_gemm called with {other}"),
    }
}

/// `out(t, r) = W[r] · A[t]`, bit-identical to `quant_rows_dotprod`.
fn quant_gemm_dotprod(ty: GgmlType, w: &[u8], a: &[u8], mut out: GemmOut<'_>) {
    if has_dotprod() {
        // SAFETY: the CPU has FEAT_DotProd (checked just above), which is all `quant_gemm_sdot` and the
        // `sdot` instructions inlined into it require; lengths are checked inside.
        unsafe { quant_gemm_sdot(ty, w, a, out) }
    } else {
        // Only reachable by calling the table directly on a CPU without dotprod: the row products (which
        // fall back the same way), transposed to token-major.
        assert!(gemm_supports(ty), "quant_gemm called with {ty}");
        let (n_rows, n_tok) = (out.rows(), out.n_tok());
        if n_tok == 0 || n_rows == 0 {
            return;
        }
        let mut rows = vec![0f32; n_rows * n_tok];
        quant_rows_dotprod(ty, w, a, n_tok, &mut rows);
        for t in 0..n_tok {
            let row: Vec<f32> = (0..n_rows).map(|r| rows[r * n_tok + t]).collect();
            let dst = out.token_ptr(t);
            // SAFETY: `GemmOut` guarantees `n_rows` writable floats at each token's pointer.
            unsafe { core::ptr::copy_nonoverlapping(row.as_ptr(), dst, n_rows) };
        }
    }
}
