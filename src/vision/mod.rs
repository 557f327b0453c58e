//! Image input for the Qwen3.5 vision tower (mmproj GGUFs): preprocessing, tower, merger.

pub mod preprocess;
