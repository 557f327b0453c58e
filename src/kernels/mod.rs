//! Compute kernels the model is built from. `matmul` is the single entry point for weight products; it
//! calls the kernel table chosen once for this CPU ([`kernels`]): one table per instruction set, each
//! held by tests to the scalar reference ([`scalar`]).

#[cfg(target_arch = "aarch64")]
mod arm;
pub mod attend;
pub mod attend_quant;
pub mod bf16_gemm;
mod dispatch;
pub mod fgemm;
pub mod fpenv;
mod matmul;
pub mod ops;
pub mod panel_gemm;
pub mod scalar;
pub mod stagger;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Most tokens of a call that the kernels still run in the decode layout (every weight row streamed from
/// memory once, for all the call's tokens) and `matmul` splits as decode: speculative decoding's
/// verification step (the last token and up to three drafted ones).
pub const FEW_TOKENS: usize = 4;

pub use dispatch::{
    available, by_isa, kernels, GemmOut, Isa, Kernels, Line64, OpsFns, Q8kQuants, QuantGemm,
    QuantsGemm,
};
pub use matmul::{
    can_multiply, decode_rows_per_item, matmul, matmul_with, matmuls, observe_matmuls, q8k_quants,
    release_act_buffer, MatmulObserver, ObserverGuard, Weight,
};

/// Wrapping sum of `words`, one plain sequential stream with eight independent accumulators, which
/// compilers vectorize: a read loop bound by memory, not by the adds (a memory-bandwidth probe).
pub fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = words.chunks_exact(8);
    for c in &mut it {
        for (a, x) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*x);
        }
    }
    let tail = it.remainder().iter().fold(0u64, |a, x| a.wrapping_add(*x));
    acc.iter().fold(tail, |a, x| a.wrapping_add(*x))
}

/// [`sum_words`] read as the decode kernels read weights (on x86-64 four streams with software
/// prefetch; elsewhere the plain stream): the second memory-bandwidth probe.
pub fn sum_words_streamed(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    return x86::sum_words_prefetched(words);
    #[cfg(not(target_arch = "x86_64"))]
    sum_words(words)
}
