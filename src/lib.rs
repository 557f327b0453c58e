//! deltaq: a CPU runtime for the Qwen3.5 small language models, from GGUF files.

pub mod bench;
pub mod chat;
pub mod constraint;
pub mod convert;
pub mod generate;
pub mod gguf;
pub mod hub;
pub mod imatrix;
pub mod kernels;
pub mod model;
pub mod npy;
pub mod perplexity;
pub mod quant;
pub mod quantize;
pub mod sampling;
pub mod server;
pub mod tokenizer;
pub mod vision;
