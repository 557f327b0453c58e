//! `deltaq convert`: a Hugging Face Qwen3.5 checkpoint (safetensors) → GGUF, file-compatible with
//! llama.cpp's `convert_hf_to_gguf.py` (metadata keys, order and types; tensor names, order, shapes,
//! types and data), and for quantized outtypes with `llama-quantize` run on its F32 output.
//!
//! Tensors stream from short-lived memory maps of the safetensors files through the row-wise
//! transformations of [`tensors`] into [`crate::quantize::write_gguf`], so memory stays bounded by a
//! few row chunks whatever the model size.

pub mod config;
pub mod mmproj;
pub mod safetensors;
pub mod tensors;
pub mod vocab;

use std::path::Path;

use anyhow::{bail, Context};
use serde_json::{Map, Value};

use crate::gguf::{GgufWriter, OwnedValue};
use crate::quant::GgmlType;
use crate::quantize::{sort_like_llama_quantize, write_gguf, FileType, Planned, Recipe, Summary};
use config::{str_value, Config, GGUF_ARCH};
use safetensors::Checkpoint;
use tensors::{map_name, ConvTensor, Mapped};

pub use mmproj::convert_mmproj;

/// Options of `deltaq convert`.
pub struct ConvertOptions {
    /// F32/F16/BF16/Q8_0 follow the converter's rules; every other type is llama-quantize's recipe
    /// applied to the F32 conversion.
    pub outtype: FileType,
    /// Drop the MTP (multi-token prediction) block.
    pub no_mtp: bool,
    /// `general.name` (llama.cpp's `--model-name`); default: derived from the folder name.
    pub model_name: Option<String>,
    pub overwrite: bool,
    pub progress: bool,
}

/// What a conversion did.
#[derive(Debug, Clone)]
pub struct ConvertSummary {
    pub write: Summary,
    /// Bytes of checkpoint tensors read.
    pub input_bytes: u64,
    pub n_tensors: usize,
    pub skipped_vision: usize,
    pub dropped_mtp: usize,
}

/// Whether the converter itself writes this outtype (else: llama-quantize's recipe).
pub fn is_converter_type(t: FileType) -> bool {
    matches!(
        t,
        FileType::F32 | FileType::F16 | FileType::BF16 | FileType::Q8_0
    )
}

/// Converts the checkpoint in `dir` to a GGUF at `output` (atomically; the input is only read).
pub fn convert(dir: &Path, output: &Path, opts: &ConvertOptions) -> anyhow::Result<ConvertSummary> {
    let cfg = Config::load(dir)?;
    let ckpt = Checkpoint::open(dir)?;
    for (p, _) in &ckpt.files {
        if same_file(p, output) {
            bail!("the output would overwrite the input {}", p.display());
        }
    }

    // Map every checkpoint tensor, in the converter's order.
    let (mut vision, mut dropped) = (0, 0);
    let mut out: Vec<ConvTensor<'_>> = Vec::new();
    let mut mtp_found = 0;
    for t in &ckpt.tensors {
        match map_name(&t.name, cfg.n_layer, opts.no_mtp)? {
            Mapped::Vision => vision += 1,
            Mapped::MtpDropped => dropped += 1,
            Mapped::Ignored => {}
            Mapped::Tensor(m) => {
                if let Some(i) = m.mtp {
                    mtp_found = mtp_found.max(i + 1);
                }
                out.push(ConvTensor::new(&ckpt, t, &m, &cfg)?);
            }
        }
    }
    if vision > 0 {
        eprintln!(
            "skipping {vision} vision tensor(s): the vision tower goes into a separate mmproj file (deltaq convert --mmproj)"
        );
    }
    if dropped > 0 {
        eprintln!("dropping {dropped} MTP tensor(s) (--no-mtp)");
    }
    if out.is_empty() {
        bail!("no text-model tensors found in {}", dir.display());
    }
    let n_mtp = match (mtp_found, cfg.n_mtp) {
        (0, n) => {
            if n > 0 && !opts.no_mtp {
                eprintln!(
                    "warning: config.json declares {n} MTP layer(s) but the checkpoint has no MTP tensors; writing none"
                );
            }
            0
        }
        (found, 0) => found,
        (_, n) => n,
    };
    let block_count = cfg.n_layer + n_mtp;
    for t in &out {
        if let Some(b) = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
        {
            if b.parse::<u64>().is_ok_and(|b| b >= block_count) {
                bail!(
                    "tensor '{}' belongs to layer {b}, but the model has {block_count} blocks",
                    t.src.name
                );
            }
        }
    }

    // Metadata, in the converter's order.
    let converter = is_converter_type(opts.outtype);
    let file_type = if converter { opts.outtype.id() } else { 0 };
    let n_params: u64 = out.iter().map(|t| t.ne.iter().product::<u64>()).sum();
    let mut w = GgufWriter::new();
    w.set("general.architecture", str_value(GGUF_ARCH));
    w.set("general.type", str_value("model"));
    write_sampling(dir, &mut w)?;
    let name = match &opts.model_name {
        Some(n) => n.clone(),
        None => default_name(dir, &cfg.hparams),
    };
    w.set("general.name", str_value(&name));
    w.set("general.size_label", str_value(&size_label(n_params)));
    cfg.write_model_kv(&mut w, n_mtp, file_type);
    w.set("general.quantization_version", OwnedValue::U32(2));
    vocab::write_vocab(dir, cfg.vocab_size, &mut w)?;

    let input_bytes: u64 = out.iter().map(|t| t.src.nbytes).sum();
    let n_tensors = out.len();
    let plan: Vec<Planned<'_>> = if converter {
        let base = opts.outtype.default_type();
        out.into_iter()
            .map(|t| {
                let ty = t.converter_type(base);
                Planned {
                    source: Box::new(t),
                    ty,
                }
            })
            .collect()
    } else {
        // As llama-quantize on the F32 conversion: its tensor order, its recipe, its two keys last.
        w.remove("general.quantization_version");
        w.set("general.quantization_version", OwnedValue::U32(2));
        w.remove("general.file_type");
        w.set("general.file_type", OwnedValue::U32(opts.outtype.id()));
        let mut names: Vec<String> = out.iter().map(|t| t.name.clone()).collect();
        sort_like_llama_quantize(&mut names);
        let n_gqa = cfg.n_head.checked_div(cfg.n_head_kv).unwrap_or(0);
        let mut recipe = Recipe::new(
            opts.outtype,
            false,
            names.iter().map(String::as_str),
            block_count,
            n_gqa,
        );
        let mut by_name: std::collections::HashMap<String, ConvTensor<'_>> =
            out.into_iter().map(|t| (t.name.clone(), t)).collect();
        let mut plan = Vec::with_capacity(names.len());
        for n in &names {
            let t = by_name.remove(n).expect("listed");
            let ty = recipe.choose(n, &t.ne)?.unwrap_or(GgmlType::F32);
            plan.push(Planned {
                source: Box::new(t),
                ty,
            });
        }
        plan
    };
    let write = write_gguf(output, w, &plan, opts.overwrite, opts.progress)
        .with_context(|| format!("writing {}", output.display()))?;
    Ok(ConvertSummary {
        write,
        input_bytes,
        n_tensors,
        skipped_vision: vision,
        dropped_mtp: dropped,
    })
}

/// `general.sampling.*` from generation_config.json, as llama.cpp's metadata loader writes them.
fn write_sampling(dir: &Path, w: &mut GgufWriter) -> anyhow::Result<()> {
    let path = dir.join("generation_config.json");
    if !path.is_file() {
        return Ok(());
    }
    let Ok(v) = serde_json::from_str::<Value>(&std::fs::read_to_string(&path)?) else {
        return Ok(()); // llama.cpp ignores a broken generation_config.json too
    };
    enum K {
        Str,
        Int,
        Float,
    }
    let keys: [(&[&str], &str, K); 12] = [
        (&["sequence"], "sequence", K::Str),
        (&["top_k"], "top_k", K::Int),
        (&["top_p"], "top_p", K::Float),
        (&["min_p"], "min_p", K::Float),
        (&["xtc_probability"], "xtc_probability", K::Float),
        (&["xtc_threshold"], "xtc_threshold", K::Float),
        (&["temperature"], "temp", K::Float),
        (&["penalty_last_n"], "penalty_last_n", K::Int),
        (
            &["penalty_repeat", "repetition_penalty"],
            "penalty_repeat",
            K::Float,
        ),
        (&["mirostat"], "mirostat", K::Int),
        (&["mirostat_tau"], "mirostat_tau", K::Float),
        (&["mirostat_eta"], "mirostat_eta", K::Float),
    ];
    for (src, dst, kind) in keys {
        let Some(x) = src.iter().find_map(|k| v.get(*k)).filter(|x| !x.is_null()) else {
            continue;
        };
        let key = format!("general.sampling.{dst}");
        match kind {
            K::Str => {
                if let Some(s) = x.as_str().filter(|s| !s.is_empty()) {
                    w.set(&key, str_value(s));
                }
            }
            K::Int => {
                if let Some(i) = x.as_i64() {
                    w.set(&key, OwnedValue::I32(i as i32));
                }
            }
            K::Float => {
                if let Some(f) = x.as_f64() {
                    w.set(&key, OwnedValue::F32(f as f32));
                }
            }
        }
    }
    Ok(())
}

/// `general.name` when none is given: the model id in config.json's `_name_or_path` (if it is one),
/// else the folder name, title-cased like llama.cpp's `Metadata.id_to_title`.
fn default_name(dir: &Path, hparams: &Map<String, Value>) -> String {
    let id = hparams
        .get("_name_or_path")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && s.matches('/').count() <= 1)
        .map(str::to_string)
        .or_else(|| {
            std::fs::canonicalize(dir)
                .ok()
                .and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned()))
        })
        .unwrap_or_default();
    let model = if id.contains(' ') {
        id.as_str()
    } else {
        id.split_once('/').map_or(id.as_str(), |(_, m)| m)
    };
    id_to_title(model)
}

/// llama.cpp's `Metadata.id_to_title`: words split on '-' and whitespace, all-lowercase words
/// title-cased unless they look like a version or start with a digit.
pub fn id_to_title(s: &str) -> String {
    s.trim()
        .replace('-', " ")
        .split_whitespace()
        .map(|w| {
            let has_cased = w.chars().any(|c| c.is_lowercase() || c.is_uppercase());
            let is_lower = has_cased && !w.chars().any(|c| c.is_uppercase());
            let versionish = w.starts_with(|c: char| c.is_ascii_digit())
                || (w.starts_with('v')
                    && w.len() > 1
                    && w[1..]
                        .split('.')
                        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())));
            if is_lower && !versionish {
                let mut out = String::new();
                let mut prev_alpha = false;
                for c in w.chars() {
                    if c.is_alphabetic() {
                        if prev_alpha {
                            out.extend(c.to_lowercase());
                        } else {
                            out.extend(c.to_uppercase());
                        }
                        prev_alpha = true;
                    } else {
                        out.push(c);
                        prev_alpha = false;
                    }
                }
                out
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// gguf-py's `size_label` (`model_weight_count_rounded_notation` with two significant digits).
pub fn size_label(n: u64) -> String {
    let x = n as f64;
    let (scaled, suffix) = if x > 1e12 {
        (x * 1e-12, "T")
    } else if x > 1e9 {
        (x * 1e-9, "B")
    } else if x > 1e6 {
        (x * 1e-6, "M")
    } else {
        (x * 1e-3, "K")
    };
    // Python's round() is half-to-even.
    let rounded = scaled.round_ties_even();
    let digits = format!("{}", rounded as u64).trim_start_matches('0').len();
    let fix = 2usize.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels() {
        assert_eq!(size_label(3_163_736), "3.2M");
        assert_eq!(size_label(4_354_992), "4.4M");
        assert_eq!(size_label(8_953_803_264), "9.0B");
        assert_eq!(size_label(752_393_024), "752M");
        assert_eq!(size_label(25_000_000), "25M");
    }

    #[test]
    fn titles() {
        assert_eq!(id_to_title("hf"), "Hf");
        assert_eq!(id_to_title("tiny-kjv"), "Tiny Kjv");
        assert_eq!(id_to_title("Qwen3.5-9B"), "Qwen3.5 9B");
        assert_eq!(id_to_title("tiny-r1"), "Tiny R1");
        assert_eq!(id_to_title("v1.5-base"), "v1.5 Base");
    }
}
