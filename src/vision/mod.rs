//! Image input: the vision tower of the Qwen3.5 models, from an mmproj GGUF.

pub mod mmproj;
pub mod tower;
