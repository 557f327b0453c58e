//! Compute kernels the model is built from. `matmul` is the single entry point for weight products; it
//! calls the kernel table chosen once for this CPU ([`kernels`]): one table per instruction set, each
//! held by tests to the scalar reference ([`scalar`]).

#[cfg(target_arch = "aarch64")]
mod arm;
pub mod attend;
mod dispatch;
pub mod fgemm;
pub mod fpenv;
mod matmul;
pub mod ops;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use dispatch::{available, by_isa, kernels, GemmOut, Isa, Kernels, OpsFns, QuantGemm};
pub use matmul::{can_multiply, decode_rows_per_item, matmul, matmuls, Weight};

/// Wrapping sum of `words`, read as the decode kernels read weights (on x86-64 four streams with
/// software prefetch; elsewhere one plain stream): a memory-bandwidth probe for the benchmarks.
pub fn sum_words_streamed(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    return x86::sum_words_prefetched(words);
    #[cfg(not(target_arch = "x86_64"))]
    words.iter().fold(0u64, |s, w| s.wrapping_add(*w))
}
