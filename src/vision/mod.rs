//! Image input for the Qwen3.5 models: preprocessing (image bytes → patches), the vision tower from an
//! mmproj GGUF, and its merger to the text model's width.

pub mod encoder;
pub mod mmproj;
pub mod preprocess;
pub mod tower;
