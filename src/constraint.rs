//! Constrained output: what a request asks the answer to follow (a JSON schema, any JSON object, a
//! GBNF grammar). The sampler masks every token that would leave the language.
//!
//! The engine is llguidance (the one llama.cpp and vLLM offer): a [`Compiler`] holds the model's
//! vocabulary as a token trie (built once per model, shared by every request) and compiles a
//! request's [`OutputConstraint`] into a [`Guide`], which masks the logits of each answer token and
//! follows the sampled ones.

pub mod gbnf;
#[cfg(test)]
mod tests;
pub mod tools;
mod vocab;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::tokenizer::Tokenizer;

/// The language the answer must stay in. Thinking (`<think>...</think>`) stays free-form; the
/// constraint starts with the answer.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputConstraint {
    /// Any JSON object (OpenAI `{"type": "json_object"}`, Ollama `"format": "json"`).
    JsonObject,
    /// A JSON schema (OpenAI `json_schema`, Ollama `format` as a schema, llama.cpp `json_schema`).
    JsonSchema(Value),
    /// A GBNF grammar as llama.cpp takes it (`grammar`, `--grammar-file`).
    Grammar(String),
    /// Tool calls whose arguments follow their function's schema (`tools` with `"strict": true`).
    ToolCalls(tools::ToolCalls),
}

/// A constraint that cannot be compiled: the request's fault (a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// Invalid JSON schema, or one using features llguidance does not support (named).
    #[error("unsupported or invalid JSON schema: {0}")]
    Schema(String),
    /// A GBNF grammar that does not parse or compile.
    #[error("invalid grammar: {0}")]
    Grammar(String),
    /// A strict tool whose parameters' schema cannot be compiled.
    #[error("unsupported or invalid tool parameters schema: {0}")]
    Tools(String),
    /// The vocabulary could not be prepared (not the request's fault).
    #[error("{0}")]
    Unavailable(String),
}

/// Generation cannot follow the constraint any more (an internal limit was hit or no token fits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("structured output: {0}")]
pub struct GuideError(String);

/// JSON whitespace between tokens: at most a short run, so a model cannot pad forever.
const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,12}";

/// Compiles constraints for one model's vocabulary.
pub struct Compiler {
    factory: ParserFactory,
    eog: Arc<[u32]>,
    think_open: Option<u32>,
    think_close: Option<u32>,
    /// `<tool_call>` and `</tool_call>` are tokens of the vocabulary.
    tool_tags: bool,
}

impl Compiler {
    /// Builds the token trie of `tok` (`n_vocab`: the model's logits length). Takes a moment on a
    /// 248k vocabulary: build it once per model.
    pub fn new(tok: &Tokenizer, n_vocab: usize) -> anyhow::Result<Compiler> {
        // toktrie asserts its invariants: a vocabulary it rejects is an error, not a crash.
        let env = std::panic::catch_unwind(|| vocab::TokenEnv::new(tok, n_vocab))
            .map_err(|_| anyhow::anyhow!("the vocabulary cannot be made into a token trie"))?;
        let env: TokEnv = Arc::new(env);
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        // Errors go back to the client: the reason, not a dump of the parser state.
        factory.limits_mut().verbose_errors = false;
        Ok(Compiler {
            factory,
            eog: tok.eog_ids().into(),
            think_open: tok.special_id(crate::chat::THINK_OPEN),
            think_close: tok.special_id(crate::chat::THINK_CLOSE),
            tool_tags: tok.special_id("<tool_call>").is_some()
                && tok.special_id("</tool_call>").is_some(),
        })
    }

    /// A fresh guide for one generation.
    pub fn compile(&self, c: &OutputConstraint) -> Result<Guide, ConstraintError> {
        let (grammar, err): (_, fn(String) -> ConstraintError) = match c {
            OutputConstraint::JsonObject => (
                TopLevelGrammar::from_json_schema(json_options(json!({"type": "object"}))),
                ConstraintError::Schema,
            ),
            OutputConstraint::JsonSchema(s) => (
                TopLevelGrammar::from_json_schema(json_options(s.clone())),
                ConstraintError::Schema,
            ),
            OutputConstraint::Grammar(g) => {
                let lark = gbnf::to_lark(g).map_err(|e| ConstraintError::Grammar(e.to_string()))?;
                (TopLevelGrammar::from_lark(lark), ConstraintError::Grammar)
            }
            OutputConstraint::ToolCalls(calls) => (
                TopLevelGrammar::from_lark(tools::lark(calls, self.tool_tags)),
                ConstraintError::Tools,
            ),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| err(format!("{e:#}")))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(err(e));
        }
        // A grammar whose language is empty fails on its first mask: refuse it now.
        if let Err(e) = matcher.compute_mask() {
            return Err(err(format!("{e:#}")));
        }
        Ok(Guide {
            matcher,
            mask: None,
            eog: self.eog.clone(),
            think_close: self.think_close,
            thinking: false,
        })
    }

    /// Whether a generation after `prompt` starts inside a think block (its last `<think>` is not
    /// closed): the guide then waits for `</think>`.
    pub fn starts_in_thinking(&self, prompt: &[u32]) -> bool {
        let last = |id: Option<u32>| id.and_then(|id| prompt.iter().rposition(|&t| t == id));
        match (last(self.think_open), last(self.think_close)) {
            (Some(o), Some(c)) => o > c,
            (Some(_), None) => true,
            _ => false,
        }
    }
}

/// Compact JSON with bounded whitespace, unless the schema sets llguidance's own options.
fn json_options(schema: Value) -> Value {
    let mut schema = match schema {
        Value::Bool(true) => json!({}),
        s => s,
    };
    close_objects(&mut schema, false);
    if let Value::Object(m) = &mut schema {
        m.entry("x-guidance")
            .or_insert_with(|| json!({ "whitespace_pattern": JSON_WHITESPACE }));
    }
    schema
}

/// An object schema with `properties` but no `additionalProperties` admits only its properties, as
/// llama.cpp's (and so Ollama's) schema grammars do: JSON Schema's default (any extra key) lets a model
/// that does not know when to stop write keys forever. Members of `allOf` stay open, since each
/// describes only part of the object.
fn close_objects(schema: &mut Value, in_all_of: bool) {
    if let Value::Object(m) = schema {
        if !in_all_of && m.contains_key("properties") && !m.contains_key("additionalProperties") {
            m.insert("additionalProperties".into(), Value::Bool(false));
        }
        for (key, v) in m.iter_mut() {
            match key.as_str() {
                // Maps of name -> schema.
                "properties" | "$defs" | "definitions" | "patternProperties" => {
                    if let Value::Object(sub) = v {
                        sub.values_mut().for_each(|s| close_objects(s, false));
                    }
                }
                "allOf" => {
                    if let Value::Array(a) = v {
                        a.iter_mut().for_each(|s| close_objects(s, true));
                    }
                }
                "anyOf" | "oneOf" | "prefixItems" => {
                    if let Value::Array(a) = v {
                        a.iter_mut().for_each(|s| close_objects(s, false));
                    }
                }
                "items" | "additionalProperties" | "not" => close_objects(v, false),
                _ => {}
            }
        }
    }
}

/// One generation's constraint: masks the logits of each answer token and follows the sampled ones.
pub struct Guide {
    matcher: Matcher,
    /// The tokens allowed at the current position (`None` while thinking).
    mask: Option<SimpleVob>,
    eog: Arc<[u32]>,
    think_close: Option<u32>,
    thinking: bool,
}

impl Guide {
    /// Leaves the first tokens free until `</think>` (thinking stays free-form).
    pub fn wait_for_thinking(&mut self) {
        self.thinking = self.think_close.is_some();
    }

    pub fn is_thinking(&self) -> bool {
        self.thinking
    }

    /// The answer is complete: nothing but the end of generation may follow.
    pub fn is_complete(&self) -> bool {
        !self.thinking && !self.matcher.is_error() && self.matcher.is_stopped()
    }

    /// Sets the logits of the tokens the constraint forbids at this position to −∞ (end of
    /// generation is allowed only where the answer may end). While thinking only the end of
    /// generation is forbidden: the answer is still to come.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), GuideError> {
        if self.thinking {
            for &id in self.eog.iter() {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
            return Ok(());
        }
        let mut mask = self
            .matcher
            .compute_mask()
            .map_err(|e| GuideError(format!("{e:#}")))?;
        let accepting = self
            .matcher
            .is_accepting()
            .map_err(|e| GuideError(format!("{e:#}")))?;
        for &id in self.eog.iter() {
            if (id as usize) < mask.len() {
                mask.set(id as usize, accepting);
            }
        }
        if mask.is_zero() {
            return Err(GuideError("the constraint allows no token here".into()));
        }
        apply_mask(&mask, logits);
        self.mask = Some(mask);
        Ok(())
    }

    /// Follows a sampled token: `</think>` starts the constraint; an answer token must be one the
    /// last mask allowed.
    pub fn advance(&mut self, id: u32) -> Result<(), GuideError> {
        if self.thinking {
            self.thinking = Some(id) != self.think_close;
            return Ok(());
        }
        let allowed = self
            .mask
            .as_ref()
            .is_some_and(|m| (id as usize) < m.len() && m.is_allowed(id));
        if !allowed {
            return Err(GuideError(format!(
                "token {id} was sampled outside the constraint (every allowed token was excluded)"
            )));
        }
        self.mask = None;
        if self.eog.contains(&id) {
            return Ok(());
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| GuideError(format!("{e:#}")))
    }
}

/// −∞ for every logit whose bit is clear (ids past the mask included).
fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) {
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        for (j, l) in chunk.iter_mut().enumerate() {
            if bits >> j & 1 == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}
