//! Compute kernels the model is built from. `matmul` is the single entry point for weight products: it
//! picks a row kernel per weight type from a table, so SIMD kernels plug in at exactly one place.

mod matmul;
pub mod ops;

pub use matmul::{kernel_for, matmul, Kernel, RowDot, Weight};
