//! `config.json` of a Qwen3.5 checkpoint, both as `Qwen3_5ForConditionalGeneration` (the text model's
//! fields nested under `text_config`) and as the text-only `Qwen3_5ForCausalLM`, and the `qwen35.*`
//! metadata llama.cpp's converter derives from it, in the order it writes them.

use std::path::Path;

use anyhow::{bail, Context};
use serde_json::{Map, Value};

use crate::gguf::{GgufWriter, OwnedValue, ValueType};

/// Hugging Face architectures this converter handles (all map to GGUF `qwen35`).
pub const SUPPORTED: [&str; 2] = ["Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"];

pub const GGUF_ARCH: &str = "qwen35";

/// The parsed configuration.
pub struct Config {
    /// The Hugging Face architecture name.
    pub arch: String,
    /// The top level with the text config's fields merged over it (as llama.cpp does).
    pub hparams: Map<String, Value>,
    /// Transformers' defaults for a missing `rope_parameters`, or the file's own.
    pub rope: Map<String, Value>,
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_ff: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    pub vocab_size: Option<u64>,
    /// DeltaNet key heads / value heads / key head dim / value head dim / conv kernel.
    pub hk: u64,
    pub hv: u64,
    pub dk: u64,
    pub dv: u64,
    pub conv_kernel: u64,
    /// `mtp_num_hidden_layers` (0 if absent).
    pub n_mtp: u64,
    /// Per decoder layer (without MTP): true for a DeltaNet (linear attention) layer.
    pub recurrent: Vec<bool>,
    pub full_attention_interval: u64,
}

impl Config {
    pub fn load(dir: &Path) -> anyhow::Result<Config> {
        let top = read_config_json(dir)?;
        Config::from_json(top).with_context(|| format!("in {}", dir.join("config.json").display()))
    }

    pub fn from_json(top: Map<String, Value>) -> anyhow::Result<Config> {
        let text_config = top.get("text_config").and_then(Value::as_object).cloned();
        // The architecture: the text config's own if it names one, else the top level's.
        let arch = text_config
            .as_ref()
            .and_then(|t| t.get("architectures"))
            .or_else(|| top.get("architectures"))
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .context("no \"architectures\" entry")?
            .to_string();
        if !SUPPORTED.contains(&arch.as_str()) {
            bail!(
                "unknown architecture {arch}: deltaq converts {} (Qwen3.5 dense text models)",
                SUPPORTED.join(" and ")
            );
        }
        let mut hparams = top.clone();
        if let Some(t) = text_config {
            for (k, v) in t {
                hparams.insert(k, v);
            }
        }
        let h = Hp(&hparams);
        let n_layer = h.req_u64("num_hidden_layers")?;
        let n_embd = h.req_u64("hidden_size")?;
        let n_head = h.req_u64("num_attention_heads")?;
        let hk = h.req_u64("linear_num_key_heads")?;
        let hv = h.req_u64("linear_num_value_heads")?;
        if hk == 0 || hv == 0 || hv % hk != 0 {
            bail!(
                "linear_num_value_heads ({hv}) must be a multiple of linear_num_key_heads ({hk})"
            );
        }
        let interval = h.u64("full_attention_interval")?.unwrap_or(4);
        let recurrent = match hparams.get("layer_types").filter(|v| !v.is_null()) {
            Some(v) => {
                let types = v.as_array().context("layer_types is not an array")?;
                if types.len() as u64 != n_layer {
                    bail!(
                        "layer_types has {} entries, expected num_hidden_layers ({n_layer})",
                        types.len()
                    );
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("linear_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        _ => bail!("unknown layer type {t} in layer_types"),
                    })
                    .collect::<anyhow::Result<Vec<bool>>>()?
            }
            // transformers' default when the file has none
            None => (0..n_layer)
                .map(|i| interval == 0 || (i + 1) % interval != 0)
                .collect(),
        };
        let rope = match hparams
            .get("rope_parameters")
            .or_else(|| hparams.get("rope_scaling"))
        {
            Some(Value::Object(m)) => m.clone(),
            _ => default_rope(),
        };
        let head_dim = h.u64("head_dim")?.unwrap_or(n_embd / n_head.max(1));
        Ok(Config {
            n_layer,
            n_embd,
            n_ff: h.req_u64("intermediate_size")?,
            n_head,
            n_head_kv: h.u64("num_key_value_heads")?.unwrap_or(n_head),
            head_dim,
            vocab_size: h.u64("vocab_size")?,
            hk,
            hv,
            dk: h.req_u64("linear_key_head_dim")?,
            dv: h.req_u64("linear_value_head_dim")?,
            conv_kernel: h.req_u64("linear_conv_kernel_dim")?,
            n_mtp: h.u64("mtp_num_hidden_layers")?.unwrap_or(0),
            recurrent,
            full_attention_interval: interval,
            arch,
            hparams,
            rope,
        })
    }

    /// The model part of the metadata (after `general.name` / `general.size_label`), exactly as
    /// llama.cpp's `Qwen3_5TextModel.set_gguf_parameters` writes it. `n_mtp` is the number of MTP
    /// blocks written (0 with `--no-mtp`).
    pub fn write_model_kv(&self, w: &mut GgufWriter, n_mtp: u64, file_type: u32) {
        let a = GGUF_ARCH;
        let h = Hp(&self.hparams);
        let block_count = self.n_layer + n_mtp;
        let u32v = |v: u64| OwnedValue::U32(v as u32);
        w.set(&format!("{a}.block_count"), u32v(block_count));
        let first = |keys: &[&str]| keys.iter().find_map(|k| self.hparams.get(*k));
        let as_u64 = |v: Option<&Value>| v.and_then(Value::as_u64);
        if let Some(n) = as_u64(first(&[
            "max_position_embeddings",
            "n_ctx",
            "n_positions",
            "max_length",
            "max_sequence_length",
            "model_max_length",
        ])) {
            w.set(&format!("{a}.context_length"), u32v(n));
        }
        w.set(&format!("{a}.embedding_length"), u32v(self.n_embd));
        w.set(&format!("{a}.feed_forward_length"), u32v(self.n_ff));
        w.set(&format!("{a}.attention.head_count"), u32v(self.n_head));
        if h.0.contains_key("num_key_value_heads") {
            w.set(
                &format!("{a}.attention.head_count_kv"),
                u32v(self.n_head_kv),
            );
        }
        if self.hparams.get("is_causal") == Some(&Value::Bool(false)) {
            w.set(&format!("{a}.attention.causal"), OwnedValue::Bool(false));
        }
        // Rope scaling (none in the released models); "default" writes nothing.
        let rope_type = self.rope.get("rope_type").or_else(|| self.rope.get("type"));
        let factor = self.rope.get("factor").and_then(Value::as_f64);
        match (rope_type.and_then(Value::as_str), factor) {
            (Some("linear"), Some(f)) => {
                w.set(&format!("{a}.rope.scaling.type"), str_value("linear"));
                w.set(
                    &format!("{a}.rope.scaling.factor"),
                    OwnedValue::F32(f as f32),
                );
            }
            (Some("yarn"), Some(f)) => {
                w.set(&format!("{a}.rope.scaling.type"), str_value("yarn"));
                w.set(
                    &format!("{a}.rope.scaling.factor"),
                    OwnedValue::F32(f as f32),
                );
                if let Some(n) = as_u64(self.rope.get("original_max_position_embeddings")) {
                    w.set(
                        &format!("{a}.rope.scaling.original_context_length"),
                        u32v(n),
                    );
                }
            }
            (Some(t), _) if t != "default" => {
                eprintln!("warning: rope type '{t}' is not converted");
            }
            _ => {}
        }
        let sections = self.rope.get("mrope_section").and_then(Value::as_array);
        if let Some(s) = sections {
            let mut v: Vec<OwnedValue> = s
                .iter()
                .map(|x| OwnedValue::I32(x.as_i64().unwrap_or(0) as i32))
                .collect();
            while v.len() < 4 {
                v.push(OwnedValue::I32(0));
            }
            v.truncate(4);
            w.set(
                &format!("{a}.rope.dimension_sections"),
                OwnedValue::Array(ValueType::I32, v),
            );
        }
        let theta = self.rope.get("rope_theta").or_else(|| {
            [
                "global_rope_theta",
                "rope_global_theta",
                "rope_theta_global",
                "rope_theta",
                "rotary_emb_base",
            ]
            .iter()
            .find_map(|k| self.hparams.get(*k))
        });
        if let Some(t) = theta.and_then(Value::as_f64) {
            w.set(&format!("{a}.rope.freq_base"), OwnedValue::F32(t as f32));
        }
        if let Some(e) = first(&["rms_norm_eps", "norm_eps"]).and_then(Value::as_f64) {
            w.set(
                &format!("{a}.attention.layer_norm_rms_epsilon"),
                OwnedValue::F32(e as f32),
            );
        }
        if self.hparams.get("head_dim").is_some_and(|v| !v.is_null()) {
            w.set(&format!("{a}.attention.key_length"), u32v(self.head_dim));
            w.set(&format!("{a}.attention.value_length"), u32v(self.head_dim));
        }
        w.set("general.file_type", OwnedValue::U32(file_type));
        if n_mtp > 0 {
            w.set(&format!("{a}.nextn_predict_layers"), u32v(n_mtp));
        }
        w.set(&format!("{a}.ssm.conv_kernel"), u32v(self.conv_kernel));
        w.set(&format!("{a}.ssm.state_size"), u32v(self.dk));
        w.set(&format!("{a}.ssm.group_count"), u32v(self.hk));
        w.set(&format!("{a}.ssm.time_step_rank"), u32v(self.hv));
        w.set(&format!("{a}.ssm.inner_size"), u32v(self.dv * self.hv));
        let mut rec: Vec<OwnedValue> = self
            .recurrent
            .iter()
            .map(|&r| OwnedValue::Bool(r))
            .collect();
        rec.resize(block_count as usize, OwnedValue::Bool(false));
        w.set(
            &format!("{a}.attention.recurrent_layers"),
            OwnedValue::Array(ValueType::Bool, rec),
        );
        w.set(
            &format!("{a}.full_attention_interval"),
            u32v(self.full_attention_interval),
        );
        let partial = self
            .rope
            .get("partial_rotary_factor")
            .or_else(|| {
                ["partial_rotary_factor", "rope_pct", "rope_percent"]
                    .iter()
                    .find_map(|k| self.hparams.get(*k))
            })
            .and_then(Value::as_f64)
            .unwrap_or(0.25);
        w.set(
            &format!("{a}.rope.dimension_count"),
            u32v((self.head_dim as f64 * partial) as u64),
        );
        if sections.is_none() {
            w.set(
                &format!("{a}.rope.dimension_sections"),
                OwnedValue::Array(
                    ValueType::I32,
                    [11, 11, 10, 0].map(OwnedValue::I32).to_vec(),
                ),
            );
        }
    }
}

/// The top-level object of `dir/config.json`.
pub fn read_config_json(dir: &Path) -> anyhow::Result<Map<String, Value>> {
    let path = dir.join("config.json");
    if !dir.is_dir() {
        bail!("{} is not a folder", dir.display());
    }
    if !path.is_file() {
        bail!(
            "{} has no config.json: is it a Hugging Face checkpoint folder?",
            dir.display()
        );
    }
    read_json_object(&path)
}

/// A JSON file whose top level is an object.
pub fn read_json_object(path: &Path) -> anyhow::Result<Map<String, Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let top: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    match top {
        Value::Object(m) => Ok(m),
        _ => bail!("{} is not a JSON object", path.display()),
    }
}

pub fn str_value(s: &str) -> OwnedValue {
    OwnedValue::String(s.as_bytes().to_vec())
}

/// transformers' `Qwen3_5TextConfig` default rope parameters.
fn default_rope() -> Map<String, Value> {
    let v = serde_json::json!({
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": true,
    });
    v.as_object().expect("object").clone()
}

/// Typed look-ups in the merged hyperparameters.
struct Hp<'a>(&'a Map<String, Value>);

impl Hp<'_> {
    fn u64(&self, key: &str) -> anyhow::Result<Option<u64>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .with_context(|| format!("\"{key}\" is {v}, expected a non-negative integer")),
        }
    }

    fn req_u64(&self, key: &str) -> anyhow::Result<u64> {
        self.u64(key)?
            .with_context(|| format!("\"{key}\" is missing"))
    }
}
