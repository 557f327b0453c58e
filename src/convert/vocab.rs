//! The tokenizer metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) from `tokenizer.json`,
//! `tokenizer_config.json` and `config.json`, as llama.cpp's `_set_vocab_gpt2` + `SpecialVocab` write it.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context};
use serde_json::{Map, Value};

use super::config::str_value;
use crate::gguf::{GgufWriter, OwnedValue, ValueType};

/// GGUF token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The pre-tokenizer regex of Qwen3.5's tokenizer.json, which llama.cpp knows as `qwen35`.
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Special-token kinds in the order llama.cpp looks them up, with their GGUF id key (None: not written).
const SPECIAL: [(&str, Option<&str>); 7] = [
    ("bos", Some("tokenizer.ggml.bos_token_id")),
    ("eos", Some("tokenizer.ggml.eos_token_id")),
    ("unk", Some("tokenizer.ggml.unknown_token_id")),
    ("sep", Some("tokenizer.ggml.seperator_token_id")),
    ("pad", Some("tokenizer.ggml.padding_token_id")),
    ("cls", None),
    ("mask", Some("tokenizer.ggml.mask_token_id")),
];

fn read_json(path: &Path) -> anyhow::Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    Ok(Some(v))
}

/// Writes the tokenizer keys. `vocab_size` is the config's (the embedding rows); ids the tokenizer
/// does not define become `[PAD<id>]` (type UNUSED).
pub fn write_vocab(dir: &Path, vocab_size: Option<u64>, w: &mut GgufWriter) -> anyhow::Result<()> {
    let tok_path = dir.join("tokenizer.json");
    let tok = read_json(&tok_path)?.with_context(|| {
        format!(
            "{} has no tokenizer.json (deltaq converts byte-level BPE tokenizers in tokenizers' JSON format)",
            dir.display()
        )
    })?;
    let model = tok
        .get("model")
        .and_then(Value::as_object)
        .context("tokenizer.json has no \"model\"")?;
    if model.get("type").and_then(Value::as_str) != Some("BPE") {
        bail!("tokenizer.json: the tokenizer model is not BPE");
    }
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .context("tokenizer.json has no model.vocab")?;
    let added: Vec<&Map<String, Value>> = tok
        .get("added_tokens")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_object).collect())
        .unwrap_or_default();

    // id -> token text, the base vocabulary overlaid with the added tokens.
    let mut by_id: HashMap<u64, String> = HashMap::new();
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .with_context(|| format!("tokenizer.json: bad id for {text:?}"))?;
        by_id.insert(id, text.clone());
    }
    // Added tokens: content -> (special)
    let mut added_special: HashMap<String, bool> = HashMap::new();
    for a in &added {
        let (Some(id), Some(content)) = (
            a.get("id").and_then(Value::as_u64),
            a.get("content").and_then(Value::as_str),
        ) else {
            bail!("tokenizer.json: malformed added token {a:?}");
        };
        by_id.insert(id, content.to_string());
        let special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
        added_special.insert(content.to_string(), special);
    }
    let max_id = by_id.keys().copied().max().unwrap_or(0);
    let n_vocab = vocab_size.unwrap_or(by_id.len() as u64);
    if !by_id.is_empty() && max_id >= n_vocab {
        bail!("the tokenizer has token id {max_id}, but vocab_size is {n_vocab}");
    }

    let mut tokens = Vec::with_capacity(n_vocab as usize);
    let mut types = Vec::with_capacity(n_vocab as usize);
    for i in 0..n_vocab {
        match by_id.get(&i) {
            None => {
                tokens.push(format!("[PAD{i}]"));
                types.push(UNUSED);
            }
            Some(t) => match added_special.get(t) {
                Some(&special) if special || looks_special(t) => {
                    tokens.push(t.clone());
                    types.push(CONTROL);
                }
                Some(_) => {
                    tokens.push(t.replace('\u{2581}', " "));
                    types.push(USER_DEFINED);
                }
                None => {
                    tokens.push(t.clone());
                    types.push(NORMAL);
                }
            },
        }
    }

    check_pre_tokenizer(&tok);
    w.set("tokenizer.ggml.model", str_value("gpt2"));
    w.set("tokenizer.ggml.pre", str_value("qwen35"));
    w.set(
        "tokenizer.ggml.tokens",
        OwnedValue::Array(
            ValueType::String,
            tokens
                .into_iter()
                .map(|t| OwnedValue::String(t.into_bytes()))
                .collect(),
        ),
    );
    w.set(
        "tokenizer.ggml.token_type",
        OwnedValue::Array(
            ValueType::I32,
            types.into_iter().map(OwnedValue::I32).collect(),
        ),
    );

    // Merges, "left right" (spaces inside a part written as U+0120, as llama.cpp does).
    let merges: Vec<String> = match model.get("merges").and_then(Value::as_array) {
        None => vec![],
        Some(m) => m
            .iter()
            .map(|e| match e {
                Value::String(s) => Ok(s.clone()),
                Value::Array(p) if p.len() == 2 => {
                    let part = |v: &Value| -> anyhow::Result<String> {
                        let s = v.as_str().context("tokenizer.json: bad merge")?;
                        Ok(s.replace(' ', "\u{0120}"))
                    };
                    Ok(format!("{} {}", part(&p[0])?, part(&p[1])?))
                }
                _ => bail!("tokenizer.json: unknown merges format"),
            })
            .collect::<anyhow::Result<_>>()?,
    };
    if merges.is_empty() {
        eprintln!("warning: tokenizer.json has no merges, the model will not tokenize");
    } else {
        w.set(
            "tokenizer.ggml.merges",
            OwnedValue::Array(
                ValueType::String,
                merges
                    .into_iter()
                    .map(|m| OwnedValue::String(m.into_bytes()))
                    .collect(),
            ),
        );
    }

    // Special token ids: tokenizer_config.json's names first, then config.json's ids.
    let tc = read_json(&dir.join("tokenizer_config.json"))?;
    let tc = tc.as_ref().and_then(Value::as_object);
    let mut ids: Vec<(&str, u64)> = Vec::new();
    let mut add_flags: Vec<(&str, bool)> = Vec::new();
    if let Some(pp) = tok.get("post_processor").filter(|v| !v.is_null()) {
        let procs: Vec<&Value> = match pp.get("processors").and_then(Value::as_array) {
            Some(a) => a.iter().collect(),
            None => vec![pp],
        };
        for p in procs {
            match p.get("type").and_then(Value::as_str) {
                Some("ByteLevel") => {
                    for k in ["bos", "eos"] {
                        if !add_flags.iter().any(|(t, _)| *t == k) {
                            add_flags.push((k, false));
                        }
                    }
                }
                Some("RobertaProcessing") => {
                    for k in ["bos", "eos", "sep"] {
                        add_flags.retain(|(t, _)| *t != k);
                        add_flags.push((k, true));
                    }
                }
                Some(other) => eprintln!(
                    "warning: tokenizer.json post-processor {other} is not interpreted (add_bos/add_eos from tokenizer_config.json only)"
                ),
                None => {}
            }
        }
    }
    let mut chat_template: Option<Value> = None;
    if let Some(tc) = tc.filter(|m| !m.is_empty()) {
        let jinja = dir.join("chat_template.jinja");
        let alt = if jinja.is_file() {
            Some(Value::String(
                std::fs::read_to_string(&jinja)
                    .with_context(|| format!("reading {}", jinja.display()))?,
            ))
        } else {
            read_json(&dir.join("chat_template.json"))?
                .and_then(|v| v.get("chat_template").cloned())
        };
        chat_template = tc.get("chat_template").cloned().or(alt);
        for (typ, _) in SPECIAL {
            if let Some(Value::Bool(b)) = tc.get(&format!("add_{typ}_token")) {
                if !add_flags.iter().any(|(t, _)| *t == typ) {
                    add_flags.push((typ, *b));
                }
            }
            let content = match tc.get(&format!("{typ}_token")) {
                Some(Value::String(s)) => s.as_str(),
                Some(Value::Object(o)) => match o.get("content").and_then(Value::as_str) {
                    Some(s) => s,
                    None => continue,
                },
                _ => continue,
            };
            let id = added.iter().find_map(|a| {
                (a.get("content").and_then(Value::as_str) == Some(content))
                    .then(|| a.get("id").and_then(Value::as_u64))
                    .flatten()
            });
            if let Some(id) = id {
                if !ids.iter().any(|(t, _)| *t == typ) {
                    ids.push((typ, id));
                }
            }
        }
    }
    if let Some(cfg) = read_json(&dir.join("config.json"))? {
        for (typ, _) in SPECIAL {
            let key = format!("{typ}_token_id");
            let id = match cfg.get(&key).filter(|v| !v.is_null()) {
                Some(v) => Some(v),
                None => cfg.get("text_config").and_then(|t| t.get(&key)),
            };
            if let Some(id) = id.and_then(Value::as_u64) {
                if !ids.iter().any(|(t, _)| *t == typ) {
                    ids.push((typ, id));
                }
            }
        }
    }
    for (typ, id) in ids {
        if let Some((_, Some(key))) = SPECIAL.iter().find(|(t, _)| *t == typ) {
            w.set(key, OwnedValue::U32(id as u32));
        }
    }
    for (typ, b) in add_flags {
        if matches!(typ, "bos" | "eos" | "sep") {
            w.set(
                &format!("tokenizer.ggml.add_{typ}_token"),
                OwnedValue::Bool(b),
            );
        }
    }
    match chat_template {
        Some(Value::String(s)) if !s.is_empty() => w.set("tokenizer.chat_template", str_value(&s)),
        Some(Value::Array(list)) => {
            let mut default = None;
            let mut names = Vec::new();
            for c in &list {
                let name: String = c
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .chars()
                    .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
                    .collect();
                let Some(t) = c.get("template").and_then(Value::as_str) else {
                    continue;
                };
                if name == "default" {
                    default = Some(t.to_string());
                } else if !name.is_empty() {
                    w.set(&format!("tokenizer.chat_template.{name}"), str_value(t));
                    names.push(OwnedValue::String(name.into_bytes()));
                }
            }
            if !names.is_empty() {
                w.set(
                    "tokenizer.chat_templates",
                    OwnedValue::Array(ValueType::String, names),
                );
            }
            if let Some(d) = default {
                w.set("tokenizer.chat_template", str_value(&d));
            }
        }
        _ => {}
    }
    Ok(())
}

/// llama.cpp's `does_token_look_special`.
fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// The GGUF always says `qwen35`; warn when the tokenizer's split regex is not Qwen3.5's.
fn check_pre_tokenizer(tok: &Value) {
    let found = tok
        .get("pre_tokenizer")
        .and_then(|p| p.get("pretokenizers"))
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter().find_map(|p| {
                p.get("pattern")
                    .and_then(|x| x.get("Regex"))
                    .and_then(Value::as_str)
            })
        });
    if found != Some(QWEN35_REGEX) {
        eprintln!(
            "warning: tokenizer.json's pre-tokenizer is not Qwen3.5's; writing tokenizer.ggml.pre = qwen35 anyway"
        );
    }
}
