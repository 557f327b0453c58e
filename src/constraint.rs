//! Constrained output: what a request asks the answer to follow (a JSON schema, any JSON object, a
//! GBNF grammar). The sampler masks every token that would leave the language.

use serde_json::Value;

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
}
