//! The IQ ("importance") formats: lattice codebooks (IQ2/IQ3/IQ1) and non-linear levels (IQ4), with the
//! ternary (TQ1_0, TQ2_0) and MXFP4 layouts beside them.

pub mod blocks;
pub mod grids;
mod iq3s;
mod iq3xxs;
mod iq4;
mod lattice3;
mod mxfp4;
mod ternary;

pub use blocks::*;
pub use mxfp4::{e8m0_to_f32_half, KVALUES_MXFP4};

#[cfg(test)]
mod vector_tests;
