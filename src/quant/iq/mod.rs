//! The IQ ("importance") formats: lattice codebooks (IQ2/IQ3/IQ1) and non-linear levels (IQ4).

pub mod grids;
