//! The GGUF container: a zero-copy reader over a memory map and a streaming, atomic writer.

mod reader;
mod value;
mod writer;

pub use reader::{GgufFile, TensorInfo};
pub use value::{ArrayView, OwnedValue, Value, ValueType};
pub(crate) use writer::readable_by_all;
pub use writer::{GgufWriter, TensorSpec};

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;
/// ggml's GGML_MAX_NAME (including the NUL it adds): names are at most 63 bytes.
pub const MAX_NAME_LEN: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{0}")]
    Io(String),
    #[error("not a GGUF file: {0}")]
    NotGguf(String),
    #[error("truncated GGUF: {0}")]
    Truncated(String),
    #[error("invalid GGUF: {0}")]
    Invalid(String),
    #[error("unsupported GGUF: {0}")]
    Unsupported(String),
    #[error("missing {0}")]
    Missing(String),
}

impl GgufError {
    /// Prefixes the message with where the error happened.
    pub(crate) fn context(self, ctx: &str) -> GgufError {
        use GgufError::*;
        match self {
            Io(m) => Io(format!("{ctx}: {m}")),
            NotGguf(m) => NotGguf(format!("{ctx}: {m}")),
            Truncated(m) => Truncated(format!("{ctx}: {m}")),
            Invalid(m) => Invalid(format!("{ctx}: {m}")),
            Unsupported(m) => Unsupported(format!("{ctx}: {m}")),
            Missing(m) => Missing(format!("{ctx}: {m}")),
        }
    }

    pub(crate) fn in_file(self, path: &std::path::Path) -> GgufError {
        self.context(&path.display().to_string())
    }
}
