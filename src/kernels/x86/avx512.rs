//! The AVX-512 table (F, BW, VL, VNNI): `vpdpbusd` / `vpdpwssd` integer dot products on 256-bit vectors
//! (EVEX encoding: 32 registers, so larger tiles), the same kernel bodies as AVX2.

use core::arch::x86_64::*;

use super::{
    Iq3S, Iq3Xxs, Simd, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0,
};
use crate::kernels::dispatch::{GemmOut, Isa, Kernels, Q8kQuants, QuantGemm, QuantsGemm};
use crate::quant::GgmlType;

/// Handed out by `dispatch::available()` only when the CPU reports AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI.
pub static KERNELS: Kernels = TABLE;

/// This table with the K-quants' prefill GEMM on AMX-INT8 tiles ([`super::kgemm_amx`], bit-identical to
/// the AVX-512 one); handed out only when [`super::kgemm_amx::detected`] also holds.
pub static KERNELS_AMX: Kernels = Kernels {
    isa: Isa::Amx,
    quant_gemm: Some(QuantGemm {
        supports: gemm_supports,
        run: gemm_any_amx,
        run_quants: Some(QuantsGemm {
            supports: super::kgemm_supports,
            run: quant_gemm_amx_quants,
        }),
    }),
    ..TABLE
};

const TABLE: Kernels = Kernels {
    isa: Isa::Avx512,
    quant_rows,
    quant_gemm: Some(QuantGemm {
        supports: gemm_supports,
        run: gemm_any,
        run_quants: None,
    }),
    float_rows,
    quantize_act,
    attend_f32: super::attend::entry512::<f32>,
    attend_f16: super::attend::entry512::<half::f16>,
    attend_many_f32: super::attend::entry_many512::<f32>,
    attend_many_f16: super::attend::entry_many512::<half::f16>,
    attend_steps: super::attend::STEPS512,
    ops: super::ops::OPS,
};

/// The CPU features every function below is compiled for.
pub fn detected() -> bool {
    super::avx2::detected()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

pub(crate) struct Avx512;

impl Simd for Avx512 {
    const WIDE: bool = true;
    #[inline(always)]
    unsafe fn dot_u8i8(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn dot_u8i8_s16(acc: __m256i, a: __m256i, b: __m256i, s: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(a, b), s)
    }
}

type QuantFn = unsafe fn(&[u8], &[u8], usize, &mut [f32]);

macro_rules! entries {
    ($($name:ident => $k:ty, $rd:literal, $rp:literal, $tp:literal;)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn $name(w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
            super::quant_rows::<Avx512, $k, $rd, $rp, $tp>(w, a, n_tok, out)
        }
    )*};
}

entries! {
    q4_0 => Q4_0, 4, 4, 4;
    q4_1 => Q4_1, 4, 4, 4;
    q5_0 => Q5_0, 4, 4, 4;
    q5_1 => Q5_1, 4, 4, 4;
    q8_0 => Q8_0, 4, 4, 4;
    q2_k => Q2K, 4, 4, 4;
    q3_k => Q3K, 4, 4, 4;
    q4_k => Q4K, 16, 4, 4;
    q5_k => Q5K, 4, 4, 4;
    q6_k => Q6K, 4, 4, 4;
    iq3_xxs => Iq3Xxs, 4, 1, 16;
    iq3_s => Iq3S, 4, 1, 16;
    iq4_nl => IQ4NL, 4, 4, 4;
    iq4_xs => IQ4XS, 4, 4, 4;
    iq2_xxs => super::iq2::Iq2Xxs, 4, 1, 16;
    iq2_xs => super::iq2::Iq2Xs, 4, 1, 16;
    iq2_s => super::iq2::Iq2S, 4, 1, 16;
    iq1_s => super::iq2::Iq1S, 4, 1, 16;
    iq1_m => super::iq2::Iq1M, 4, 1, 16;
}

fn quant_rows(ty: GgmlType, w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]) {
    let f: QuantFn = match ty {
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        GgmlType::IQ3_XXS => iq3_xxs,
        GgmlType::IQ3_S => iq3_s,
        GgmlType::IQ4_NL => iq4_nl,
        GgmlType::IQ4_XS => iq4_xs,
        GgmlType::IQ2_XXS => iq2_xxs,
        GgmlType::IQ2_XS => iq2_xs,
        GgmlType::IQ2_S => iq2_s,
        GgmlType::IQ1_S => iq1_s,
        GgmlType::IQ1_M => iq1_m,
        // Formats without a kernel here (TQ1_0, TQ2_0, MXFP4): the scalar reference.
        _ => return crate::kernels::scalar::quant_rows(ty, w, a, n_tok, out),
    };
    // SAFETY: this table is only handed out after `detected()` (is_x86_feature_detected!) confirmed
    // AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI, the features `f` is compiled for; lengths are checked inside.
    unsafe { f(w, a, n_tok, out) }
}

super::kgemm_entry!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", kgemm);
super::kgemm_entry!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    kgemm_amx,
    quant_gemm_amx
);
super::kgemm_entry!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    kgemm_amx,
    quant_gemm_amx_quants,
    quants
);

/// The prefill GEMMs: the K-quants' ([`super::kgemm`]) and the IQ formats' ([`super::iqgemm`]).
fn gemm_supports(ty: GgmlType) -> bool {
    super::kgemm_supports(ty) || super::iqgemm::supports(ty)
}

fn gemm_any(ty: GgmlType, w: &[u8], a: &[u8], out: GemmOut<'_>) {
    iq_gemm_or(ty, w, a, out, quant_gemm)
}

/// The AMX table's: the K-quants on the tiles (the table is only handed out after
/// `kgemm_amx::detected()`).
fn gemm_any_amx(ty: GgmlType, w: &[u8], a: &[u8], out: GemmOut<'_>) {
    iq_gemm_or(ty, w, a, out, quant_gemm_amx)
}

/// The IQ formats' GEMM, or `kquants` for the K-quants.
fn iq_gemm_or(
    ty: GgmlType,
    w: &[u8],
    a: &[u8],
    out: GemmOut<'_>,
    kquants: fn(GgmlType, &[u8], &[u8], GemmOut<'_>),
) {
    if super::iqgemm::supports(ty) {
        // SAFETY: the table is only handed out after all its features were detected (see `quant_rows`).
        unsafe { super::iqgemm::gemm_avx512(ty, w, a, out) }
    } else {
        kquants(ty, w, a, out)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn float_rows_impl(ty: GgmlType, w: &[u8], a: &[f32], n_tok: usize, out: &mut [f32]) {
    super::float_rows::<4, 4, 4>(ty, w, a, n_tok, out)
}

fn float_rows(ty: GgmlType, w: &[u8], a: &[f32], n_tok: usize, out: &mut [f32]) {
    // SAFETY: the table is only handed out after all its features were detected (see `quant_rows`).
    unsafe { float_rows_impl(ty, w, a, n_tok, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn quantize_act_impl(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    super::quantize_act(ty, x, out)
}

fn quantize_act(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    // SAFETY: the table is only handed out after all its features were detected (see `quant_rows`).
    unsafe { quantize_act_impl(ty, x, out) }
}
