//! The IQ ("importance") formats: lattice codebooks (IQ2/IQ3/IQ1) and non-linear levels (IQ4), with the
//! ternary (TQ1_0, TQ2_0) and MXFP4 layouts beside them.

pub mod blocks;
pub mod grids;
mod iq1;
mod iq2s;
mod iq2xs;
mod iq2xxs;
mod iq3s;
mod iq3xxs;
mod iq4;
pub mod lattice;
mod lattice3;
#[cfg(test)]
mod lattice_tests;
mod mxfp4;
mod search;
mod ternary;

pub use blocks::*;
pub use mxfp4::{e8m0_to_f32_half, KVALUES_MXFP4};

#[cfg(test)]
mod vector_tests;
