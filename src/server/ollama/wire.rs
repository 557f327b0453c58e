//! Ollama's request and response bodies as serde types (github.com/ollama/ollama, docs/api.md).
//! Unknown fields are ignored, as Ollama does: clients send options this server has no use for.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /api/chat`.
#[derive(Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    #[serde(default)]
    pub messages: Vec<Message>,
    pub tools: Option<Vec<Tool>>,
    /// `"json"` or a JSON schema.
    pub format: Option<Value>,
    pub options: Option<Options>,
    pub stream: Option<bool>,
    /// `true`/`false`, or a level (`"high"`, `"medium"`, `"low"`) that turns thinking on.
    pub think: Option<Value>,
    pub keep_alive: Option<KeepAlive>,
}

/// `POST /api/generate`.
#[derive(Deserialize)]
pub struct GenerateRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub suffix: Option<String>,
    pub system: Option<String>,
    pub template: Option<String>,
    /// The deprecated conversation context of an earlier answer: ignored (the prompt cache finds a
    /// shared prefix by itself).
    #[allow(dead_code)]
    pub context: Option<Vec<i64>>,
    pub raw: Option<bool>,
    pub images: Option<Vec<String>>,
    pub format: Option<Value>,
    pub options: Option<Options>,
    pub stream: Option<bool>,
    pub think: Option<Value>,
    pub keep_alive: Option<KeepAlive>,
}

/// `POST /api/show` (older clients send `name`).
#[derive(Deserialize)]
pub struct ShowRequest {
    pub model: Option<String>,
    pub name: Option<String>,
    #[allow(dead_code)]
    pub verbose: Option<bool>,
}

/// How long the model stays loaded: a duration string ("5m") or seconds. The model stays loaded for
/// the server's life, so it is only checked for its type.
#[derive(Deserialize)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum KeepAlive {
    Seconds(f64),
    Duration(String),
}

#[derive(Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Option<String>,
    pub thinking: Option<String>,
    /// Base64 images (user messages).
    pub images: Option<Vec<String>>,
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// The tool a `tool` message answers (the template does not need it).
    #[allow(dead_code)]
    pub tool_name: Option<String>,
}

#[derive(Deserialize)]
pub struct ToolCallIn {
    pub function: ToolCallFunctionIn,
}

#[derive(Deserialize)]
pub struct ToolCallFunctionIn {
    pub name: String,
    pub arguments: Option<Map<String, Value>>,
}

/// A tool the model may call: `{"type": "function", "function": {"name", "description", "parameters"}}`.
#[derive(Deserialize, Serialize)]
pub struct Tool {
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: ToolFunction,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Deserialize, Serialize)]
pub struct ToolFunction {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

/// The model options this server uses; the others (num_gpu, num_thread, use_mmap, ...) are ignored.
#[derive(Deserialize, Default)]
pub struct Options {
    pub num_ctx: Option<i64>,
    pub num_predict: Option<i64>,
    pub temperature: Option<f64>,
    pub top_k: Option<i64>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    /// Ollama takes an array of strings; a single string is accepted too.
    pub stop: Option<Stop>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// Not Ollama's: the OpenAI endpoints' llama.cpp extension (generate past the end-of-text token).
    pub ignore_eos: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// A chat answer (whole, or one streamed piece).
#[derive(Serialize)]
pub struct ChatResponse<'a> {
    pub model: &'a str,
    pub created_at: String,
    pub message: OutMessage,
    pub done: bool,
    #[serde(flatten)]
    pub end: Option<Final>,
}

#[derive(Serialize)]
pub struct OutMessage {
    pub role: &'static str,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

#[derive(Serialize)]
pub struct ToolCallOut {
    pub function: ToolCallFunctionOut,
}

#[derive(Serialize)]
pub struct ToolCallFunctionOut {
    pub index: usize,
    pub name: String,
    pub arguments: Value,
}

/// A generate answer (whole, or one streamed piece).
#[derive(Serialize)]
pub struct GenerateResponse<'a> {
    pub model: &'a str,
    pub created_at: String,
    pub response: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    pub done: bool,
    #[serde(flatten)]
    pub end: Option<Final>,
}

/// What the last object of an answer adds: why it ended and the timings (nanoseconds).
#[derive(Serialize)]
pub struct Final {
    pub done_reason: &'static str,
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: usize,
    pub prompt_eval_duration: u64,
    pub eval_count: usize,
    pub eval_duration: u64,
}

/// `{"error": "..."}`: every Ollama error body, and the last line of a stream that failed.
#[derive(Serialize)]
pub struct ErrorBody<'a> {
    pub error: &'a str,
}

#[derive(Serialize, Clone)]
pub struct Details {
    pub parent_model: String,
    pub format: &'static str,
    pub family: String,
    pub families: Vec<String>,
    pub parameter_size: String,
    pub quantization_level: String,
}

/// An entry of `/api/tags`.
#[derive(Serialize)]
pub struct ListedModel<'a> {
    pub name: &'a str,
    pub model: &'a str,
    pub modified_at: &'a str,
    pub size: u64,
    pub details: &'a Details,
}

#[derive(Serialize)]
pub struct TagsResponse<'a> {
    pub models: Vec<ListedModel<'a>>,
}

/// An entry of `/api/ps`.
#[derive(Serialize)]
pub struct RunningModel<'a> {
    pub name: &'a str,
    pub model: &'a str,
    pub size: u64,
    pub details: &'a Details,
    pub expires_at: &'a str,
    pub size_vram: u64,
    pub context_length: usize,
}

#[derive(Serialize)]
pub struct PsResponse<'a> {
    pub models: Vec<RunningModel<'a>>,
}

#[derive(Serialize)]
pub struct ShowResponse<'a> {
    pub license: &'a str,
    pub modelfile: String,
    pub parameters: String,
    pub template: &'a str,
    pub details: &'a Details,
    pub model_info: &'a Map<String, Value>,
    pub capabilities: Vec<&'static str>,
    pub modified_at: &'a str,
}

#[derive(Serialize)]
pub struct VersionResponse {
    pub version: &'static str,
}

/// The answer to a chat without messages: the model is loaded (it always is).
#[derive(Serialize)]
pub struct ChatLoad<'a> {
    pub model: &'a str,
    pub created_at: String,
    pub message: OutMessage,
    pub done: bool,
    pub done_reason: &'static str,
}

/// The answer to a generate without a prompt.
#[derive(Serialize)]
pub struct GenerateLoad<'a> {
    pub model: &'a str,
    pub created_at: String,
    pub response: String,
    pub done: bool,
    pub done_reason: &'static str,
}
