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
pub use matmul::{can_multiply, matmul, matmuls, Weight};
