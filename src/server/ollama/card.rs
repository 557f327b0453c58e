//! What `/api/tags`, `/api/show` and `/api/ps` say about the served model, read from the GGUF once at
//! startup (the metadata pages are released afterwards).

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::wire::Details;
use crate::gguf::GgufFile;
use crate::quantize::FileType;

/// The served model as Ollama describes one.
pub struct ModelCard {
    pub size: u64,
    pub modified_at: String,
    pub details: Details,
    /// The GGUF's scalar metadata (arrays such as the vocabulary are left out, as Ollama does unless
    /// asked to be verbose), plus `general.parameter_count`.
    pub model_info: Map<String, Value>,
    pub template: String,
    pub license: String,
    pub file_name: String,
}

impl ModelCard {
    pub fn new(file: &GgufFile, path: &Path) -> ModelCard {
        let meta = std::fs::metadata(path).ok();
        let size = meta
            .as_ref()
            .map(|m| m.len())
            .unwrap_or(file.bytes().len() as u64);
        let modified = meta
            .and_then(|m| m.modified().ok())
            .unwrap_or_else(SystemTime::now);
        let arch = file
            .get_str("general.architecture")
            .unwrap_or("qwen35")
            .to_string();
        let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
        let quant = file
            .get_u64("general.file_type")
            .ok()
            .and_then(|id| FileType::ALL.into_iter().find(|t| t.id() as u64 == id))
            .map(|t| t.name().to_string())
            .unwrap_or_else(|| "unknown".into());
        let mut model_info = Map::new();
        for (key, v) in file.metadata() {
            if key == "tokenizer.chat_template" {
                continue;
            }
            let j = if let Some(s) = v.as_str() {
                Value::from(s)
            } else if let Some(b) = v.as_bool() {
                Value::from(b)
            } else if let Some(i) = v.as_int() {
                i64::try_from(i).map(Value::from).unwrap_or(Value::Null)
            } else if let Some(f) = v.as_f64() {
                Value::from(f)
            } else {
                continue;
            };
            model_info.insert(key.to_string(), j);
        }
        model_info
            .entry("general.parameter_count")
            .or_insert(Value::from(n_params));
        ModelCard {
            size,
            modified_at: rfc3339(modified),
            details: Details {
                parent_model: String::new(),
                format: "gguf",
                family: arch.clone(),
                families: vec![arch],
                parameter_size: parameter_size(n_params),
                quantization_level: quant,
            },
            model_info,
            template: file
                .get_str("tokenizer.chat_template")
                .unwrap_or("")
                .to_string(),
            license: file.get_str("general.license").unwrap_or("").to_string(),
            file_name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }
}

/// The name `/api/tags` lists and clients send back: Ollama names carry a tag, a bare name means
/// `:latest`.
pub fn listed_name(model_id: &str) -> String {
    if model_id.contains(':') {
        model_id.to_string()
    } else {
        format!("{model_id}:latest")
    }
}

/// Ollama's style: "751.63M", "8.0B".
fn parameter_size(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.1}B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else {
        format!("{:.2}K", x / 1e3)
    }
}

/// RFC 3339 in UTC with nanoseconds, as Ollama's `created_at`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_nanos()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let t = UNIX_EPOCH + Duration::new(1_709_251_199, 5);
        assert_eq!(rfc3339(t), "2024-02-29T23:59:59.000000005Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000000000Z");
    }

    #[test]
    fn names_and_sizes() {
        assert_eq!(listed_name("tiny"), "tiny:latest");
        assert_eq!(listed_name("qwen3.5:0.8b"), "qwen3.5:0.8b");
        assert_eq!(parameter_size(751_632_384), "751.63M");
        assert_eq!(parameter_size(8_030_000_000), "8.0B");
    }
}
