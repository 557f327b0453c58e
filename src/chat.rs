//! Chat prompts: renders the GGUF's Jinja chat template (`tokenizer.chat_template`) with MiniJinja,
//! configured like Hugging Face's `apply_chat_template` (trim_blocks, lstrip_blocks, Python string
//! methods, `raise_exception`, `tojson` in Python's `json.dumps` format), and splits generated text
//! into the `<think>` part and the answer.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use crate::gguf::{GgufError, GgufFile};

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("chat template: {0}")]
    Template(String),
}

impl From<Error> for ChatError {
    fn from(e: Error) -> ChatError {
        // `{:#}` includes the template line the error happened at.
        ChatError::Template(format!("{e:#}"))
    }
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    /// An assistant turn's thinking (rendered only for turns after the last user query).
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
            reasoning_content: None,
        }
    }

    pub fn system(content: &str) -> ChatMessage {
        ChatMessage::new("system", content)
    }

    pub fn user(content: &str) -> ChatMessage {
        ChatMessage::new("user", content)
    }

    pub fn assistant(content: &str) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }

    pub fn with_reasoning(mut self, reasoning: &str) -> ChatMessage {
        self.reasoning_content = Some(reasoning.to_string());
        self
    }

    fn to_value(&self) -> Value {
        let mut m = BTreeMap::new();
        m.insert("role", Value::from(self.role.as_str()));
        m.insert("content", Value::from(self.content.as_str()));
        if let Some(r) = &self.reasoning_content {
            m.insert("reasoning_content", Value::from(r.as_str()));
        }
        Value::from(m)
    }
}

/// Rendering options.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    /// Append the assistant prefix the model continues from.
    pub add_generation_prompt: bool,
    /// `None`: leave undefined (Qwen3.5's template then thinks); `Some(false)`: the generation
    /// prompt gets an empty think block, `<think>\n\n</think>\n\n`.
    pub enable_thinking: Option<bool>,
    /// Extra template variables (e.g. `tools`, built with `minijinja::Value::from_serialize` or by hand).
    pub extra: Vec<(String, Value)>,
}

impl ChatOptions {
    /// A generation prompt with thinking on or off.
    pub fn generation(enable_thinking: bool) -> ChatOptions {
        ChatOptions {
            add_generation_prompt: true,
            enable_thinking: Some(enable_thinking),
            extra: Vec::new(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

const TEMPLATE_NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`. `bos_token` / `eos_token` are the strings the template sees under those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(ChatError::from)?,
        );
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template of a GGUF file (`tokenizer.chat_template`); bos/eos strings from its vocabulary.
    pub fn from_gguf(f: &GgufFile) -> Result<ChatTemplate, ChatError> {
        let source = f.get_str("tokenizer.chat_template")?;
        let token = |key: &str| -> String {
            let id = f
                .get(key)
                .and_then(|v| v.as_int())
                .and_then(|i| usize::try_from(i).ok());
            let tokens = f.get_array("tokenizer.ggml.tokens").ok();
            match (id, tokens.as_ref().and_then(|t| t.strings())) {
                (Some(id), Some(mut list)) => list
                    .nth(id)
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default(),
                _ => String::new(),
            }
        };
        ChatTemplate::new(
            source,
            &token("tokenizer.ggml.bos_token_id"),
            &token("tokenizer.ggml.eos_token_id"),
        )
    }

    /// Renders a conversation.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        opts: &ChatOptions,
    ) -> Result<String, ChatError> {
        let values = messages.iter().map(|m| m.to_value()).collect::<Vec<_>>();
        self.render_values(values, opts)
    }

    /// Renders a conversation whose messages are given as template values (e.g. built from an API
    /// request's JSON, with `tool_calls` or content parts that [`ChatMessage`] does not model).
    pub fn render_values(
        &self,
        messages: Vec<Value>,
        opts: &ChatOptions,
    ) -> Result<String, ChatError> {
        let tmpl = self.env.get_template(TEMPLATE_NAME)?;
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        ctx.insert("messages".into(), Value::from(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(opts.add_generation_prompt),
        );
        if let Some(t) = opts.enable_thinking {
            ctx.insert("enable_thinking".into(), Value::from(t));
        }
        ctx.insert("bos_token".into(), Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token".into(), Value::from(self.eos_token.as_str()));
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        Ok(tmpl.render(Value::from(ctx))?)
    }
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False)` (separators `", "` and
/// `": "`, keys in insertion order, non-ASCII kept).
fn tojson(value: Value) -> Result<Value, Error> {
    let mut out = String::new();
    write_json(&value, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(v: &Value, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(f) = v.as_i64().map(|i| i.to_string()) {
                out.push_str(&f);
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                if f.is_finite() {
                    let s = format!("{f:?}");
                    out.push_str(&s);
                } else if f.is_nan() {
                    out.push_str("NaN");
                } else if f > 0.0 {
                    out.push_str("Infinity");
                } else {
                    out.push_str("-Infinity");
                }
            }
        }
        ValueKind::String => write_json_str(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json(&item, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                match key.as_str() {
                    Some(s) => write_json_str(s, out),
                    None => write_json_str(&key.to_string(), out),
                }
                out.push_str(": ");
                write_json(&v.get_item(&key)?, out)?;
            }
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("cannot serialize {} to JSON", v.kind()),
            ))
        }
    }
    Ok(())
}

fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// Generated text split into its thinking and its answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThinkSplit {
    /// The text inside `<think>…</think>` (trimmed of surrounding newlines); `None` if there was no
    /// think block.
    pub thinking: Option<String>,
    /// The text after `</think>` (leading newlines removed), or all of it without a think block.
    pub answer: String,
    /// The think block was opened but never closed (generation stopped while thinking).
    pub unfinished: bool,
}

/// Splits generated text (decoded with special tokens rendered, so that `<think>` / `</think>`
/// appear) into thinking and answer. `started_in_think`: the prompt ended inside a think block
/// (Qwen3.5's generation prompt with thinking on ends with `<think>\n`).
pub fn split_thinking(text: &str, started_in_think: bool) -> ThinkSplit {
    let trimmed = text.trim_start();
    let (inside, body) = if started_in_think {
        (true, text)
    } else if let Some(rest) = trimmed.strip_prefix(THINK_OPEN) {
        (true, rest)
    } else {
        (false, text)
    };
    if !inside {
        return ThinkSplit {
            thinking: None,
            answer: text.to_string(),
            unfinished: false,
        };
    }
    let body = body.strip_prefix(THINK_OPEN).unwrap_or(body);
    match body.find(THINK_CLOSE) {
        Some(pos) => ThinkSplit {
            thinking: Some(body[..pos].trim_matches('\n').to_string()),
            answer: body[pos + THINK_CLOSE.len()..]
                .trim_start_matches('\n')
                .to_string(),
            unfinished: false,
        },
        None => ThinkSplit {
            thinking: Some(body.trim_matches('\n').to_string()),
            answer: String::new(),
            unfinished: true,
        },
    }
}

/// Which part of the output a piece of streamed text belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Thinking,
    Answer,
}

/// Streaming version of [`split_thinking`]: feed text as it is generated, get it back labelled
/// thinking or answer, with the `<think>` / `</think>` tags removed (a tag split across pushes is
/// held back until it is complete) and the newlines right after a tag dropped.
#[derive(Clone, Debug)]
pub struct ThinkStream {
    part: Part,
    buf: String,
    /// Drop newlines at the start of the current part.
    skip_newlines: bool,
}

impl ThinkStream {
    /// `started_in_think`: see [`split_thinking`].
    pub fn new(started_in_think: bool) -> ThinkStream {
        ThinkStream {
            part: if started_in_think {
                Part::Thinking
            } else {
                Part::Answer
            },
            buf: String::new(),
            skip_newlines: true,
        }
    }

    pub fn part(&self) -> Part {
        self.part
    }

    /// Adds text; returns the labelled pieces that are now certain (empty pieces are left out).
    pub fn push(&mut self, text: &str) -> Vec<(Part, String)> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.skip_newlines {
                let n = self.buf.len() - self.buf.trim_start_matches('\n').len();
                self.buf.drain(..n);
                if self.buf.is_empty() {
                    break;
                }
                self.skip_newlines = false;
            }
            let tag = match self.part {
                Part::Thinking => THINK_CLOSE,
                Part::Answer => THINK_OPEN,
            };
            if let Some(pos) = self.buf.find(tag) {
                let before: String = self.buf[..pos].to_string();
                self.emit(&mut out, before);
                self.buf.drain(..pos + tag.len());
                self.part = match self.part {
                    Part::Thinking => Part::Answer,
                    Part::Answer => Part::Thinking,
                };
                self.skip_newlines = true;
                continue;
            }
            // Keep back a suffix that could be the start of the tag.
            let keep = (1..tag.len())
                .rev()
                .find(|&k| {
                    self.buf.len() >= k
                        && self.buf.is_char_boundary(self.buf.len() - k)
                        && tag.starts_with(&self.buf[self.buf.len() - k..])
                })
                .unwrap_or(0);
            let cut = self.buf.len() - keep;
            let ready: String = self.buf[..cut].to_string();
            self.buf.drain(..cut);
            self.emit(&mut out, ready);
            break;
        }
        out
    }

    /// Ends the stream: returns what was held back.
    pub fn finish(&mut self) -> Vec<(Part, String)> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        self.emit(&mut out, rest);
        out
    }

    fn emit(&self, out: &mut Vec<(Part, String)>, s: String) {
        if !s.is_empty() {
            out.push((self.part, s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_think_on() {
        let s = split_thinking("Let me think.\n</think>\n\nThe answer is 4.", true);
        assert_eq!(s.thinking.as_deref(), Some("Let me think."));
        assert_eq!(s.answer, "The answer is 4.");
        assert!(!s.unfinished);
        let s = split_thinking("still thinking", true);
        assert_eq!(s.thinking.as_deref(), Some("still thinking"));
        assert!(s.unfinished);
        let s = split_thinking("<think>\nhm\n</think>\n\nok", false);
        assert_eq!(s.thinking.as_deref(), Some("hm"));
        assert_eq!(s.answer, "ok");
        let s = split_thinking("plain", false);
        assert_eq!(
            s,
            ThinkSplit {
                thinking: None,
                answer: "plain".into(),
                unfinished: false
            }
        );
    }

    #[test]
    fn stream_split_across_pushes() {
        let text = "\nI should add.\n</think>\n\nIt is 4.";
        // Every split into pieces of 3 bytes (all ASCII) gives the same labelled text.
        let mut st = ThinkStream::new(true);
        let mut got: Vec<(Part, String)> = Vec::new();
        for chunk in text.as_bytes().chunks(3) {
            got.extend(st.push(std::str::from_utf8(chunk).unwrap()));
        }
        got.extend(st.finish());
        let think: String = got
            .iter()
            .filter(|(p, _)| *p == Part::Thinking)
            .map(|(_, s)| s.as_str())
            .collect();
        let answer: String = got
            .iter()
            .filter(|(p, _)| *p == Part::Answer)
            .map(|(_, s)| s.as_str())
            .collect();
        assert_eq!(think, "I should add.\n");
        assert_eq!(answer, "It is 4.");
    }

    #[test]
    fn stream_holds_back_partial_tag_only() {
        let mut st = ThinkStream::new(true);
        assert_eq!(st.push("a</th"), vec![(Part::Thinking, "a".to_string())]);
        assert_eq!(
            st.push("ing"),
            vec![(Part::Thinking, "</thing".to_string())]
        );
        assert_eq!(st.push("é</"), vec![(Part::Thinking, "é".to_string())]);
        assert_eq!(st.push("think>x"), vec![(Part::Answer, "x".to_string())]);
    }

    #[test]
    fn json_like_python() {
        let mut m = BTreeMap::new();
        m.insert(
            "a",
            Value::from(vec![Value::from(1), Value::from(2.5), Value::from(true)]),
        );
        m.insert("b", Value::from("x\"y\n<é>"));
        m.insert("c", Value::from(()));
        let v = tojson(Value::from(m)).unwrap();
        assert_eq!(
            v.as_str().unwrap(),
            r#"{"a": [1, 2.5, true], "b": "x\"y\n<é>", "c": null}"#
        );
    }
}
