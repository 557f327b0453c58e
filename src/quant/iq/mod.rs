//! The IQ ("importance") formats: lattice codebooks (IQ2/IQ3/IQ1) and non-linear levels (IQ4), with the
//! ternary (TQ1_0, TQ2_0) and MXFP4 layouts beside them.

pub mod blocks;
pub mod grids;
mod iq1;
mod iq2s;
mod iq2xs;
mod iq2xxs;
pub mod lattice;
#[cfg(test)]
mod lattice_tests;
mod search;

pub use blocks::*;
