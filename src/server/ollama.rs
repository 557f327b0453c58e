//! Ollama's native API on the same engine as the OpenAI endpoints (github.com/ollama/ollama,
//! docs/api.md): `POST /api/chat`, `POST /api/generate` (streamed as newline-delimited JSON unless
//! `"stream": false`), `GET /api/tags`, `POST /api/show`, `GET /api/ps`, `GET /api/version`.
//! Errors are `{"error": "..."}` with Ollama's status codes. Requests are validated and prepared with
//! the OpenAI side's machinery ([`api::render_chat`], [`api::submit`], [`api::collect`]).

mod card;
mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use minijinja::value::Value as JValue;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::{
    chat_template, check_auth, check_context, collect, decode_base64, render_chat, submit,
    to_jinja, ApiError, ChatPrompt, GenSettings, Prepared, MAX_STOP_LEN,
};
use super::engine::{Done, Event, Finish};
use super::text::{ChatStream, Delta, ToolCall};
use super::AppState;
use crate::constraint::{ConstraintError, OutputConstraint};
use crate::model::prompt::MEDIA_MARKER;
use crate::model::Prompt;
use crate::sampling::SamplingParams;
pub use card::{listed_name, ModelCard};
use wire::*;

/// The Ollama release whose API this mirrors; clients gate features (thinking, tool calls) on it.
const OLLAMA_VERSION: &str = "0.12.0";

type St = State<Arc<AppState>>;

/// The routes under `/api`, with Ollama-shaped answers for unknown paths and wrong methods.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/chat", post(chat))
        .route("/generate", post(generate))
        .route("/tags", get(tags))
        .route("/show", post(show))
        .route("/ps", get(ps))
        .route("/version", get(version))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

// ---------------------------------------------------------------------------------------------
// Errors

/// An Ollama error: `{"error": "..."}` with a status code.
#[derive(Debug)]
pub struct OllamaError {
    status: StatusCode,
    message: String,
    retry_after: Option<u32>,
}

impl OllamaError {
    fn new(status: StatusCode, message: impl Into<String>) -> OllamaError {
        OllamaError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    fn bad(message: impl Into<String>) -> OllamaError {
        OllamaError::new(StatusCode::BAD_REQUEST, message)
    }

    fn line(&self) -> String {
        ndjson_line(&ErrorBody {
            error: &self.message,
        })
    }
}

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> OllamaError {
        OllamaError {
            status: e.status(),
            message: e.message().to_string(),
            retry_after: e.retry_after(),
        }
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&ErrorBody {
            error: &self.message,
        })
        .unwrap_or_default();
        let mut r = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// Reads (and drops) the body so the connection stays usable, as the OpenAI side's fallbacks do.
async fn not_found(_body: Result<Bytes, BytesRejection>) -> OllamaError {
    OllamaError::new(StatusCode::NOT_FOUND, "404 page not found")
}

async fn method_not_allowed(_body: Result<Bytes, BytesRejection>) -> OllamaError {
    OllamaError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint",
    )
}

// ---------------------------------------------------------------------------------------------
// Request plumbing

/// The body as `T`; a type error names the field (`options.temperature: invalid type: ...`).
fn parse<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, OllamaError> {
    let bytes = body.map_err(|r| {
        let msg = if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "request body too large".to_string()
        } else {
            format!("cannot read the request body: {}", r.body_text())
        };
        OllamaError::new(r.status(), msg)
    })?;
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(OllamaError::bad("missing request body"));
    }
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| OllamaError::bad(format!("invalid JSON in the request body: {e}")))?;
    if !v.is_object() {
        return Err(OllamaError::bad("the request body must be a JSON object"));
    }
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        OllamaError::bad(format!("invalid '{path}': {}", e.into_inner()))
    })
}

/// Runs request preparation on tokio's blocking pool (rendering, tokenizing, image encoding).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, OllamaError> + Send + 'static,
) -> Result<T, OllamaError> {
    tokio::task::spawn_blocking(f).await.map_err(|_| {
        OllamaError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal error while preparing the request",
        )
    })?
}

/// The model a request names: the served model id or the name `/api/tags` lists.
fn resolve_model(st: &AppState, name: Option<&str>) -> Result<String, OllamaError> {
    let name = name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| OllamaError::bad("model is required"))?;
    if name == st.model_id || name == listed_name(&st.model_id) {
        Ok(name.to_string())
    } else {
        Err(OllamaError::new(
            StatusCode::NOT_FOUND,
            format!("model \"{name}\" not found, try pulling it first"),
        ))
    }
}

/// `think`: a boolean, or one of Ollama's levels (which all mean thinking on for Qwen3.5).
fn thinking(think: Option<&Value>, default: bool) -> Result<bool, OllamaError> {
    match think {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if matches!(s.as_str(), "high" | "medium" | "low") => Ok(true),
        Some(_) => Err(OllamaError::bad(
            "invalid 'think': must be true, false, \"high\", \"medium\" or \"low\"",
        )),
    }
}

/// `format`: `"json"` or a JSON schema object.
fn constraint(format: Option<&Value>) -> Result<Option<OutputConstraint>, OllamaError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(OutputConstraint::JsonObject)),
        Some(schema @ Value::Object(_)) => Ok(Some(OutputConstraint::JsonSchema(schema.clone()))),
        Some(_) => Err(OllamaError::bad(
            "invalid 'format': must be \"json\" or a JSON schema object",
        )),
    }
}

/// Compiles `format` now, so an unsupported schema feature is a 400 before generation starts.
fn check_format(st: &AppState, s: &GenSettings) -> Result<(), OllamaError> {
    match s
        .constraint
        .as_ref()
        .map(|c| st.engine.compile_constraint(c))
    {
        None | Some(Ok(_)) => Ok(()),
        Some(Err(ConstraintError::Unavailable(m))) => {
            Err(OllamaError::new(StatusCode::INTERNAL_SERVER_ERROR, m))
        }
        Some(Err(e)) => Err(OllamaError::bad(format!("invalid 'format': {e}"))),
    }
}

fn in_range(name: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f32>, OllamaError> {
    match v {
        None => Ok(None),
        Some(x) if x >= lo && x <= hi => Ok(Some(x as f32)),
        Some(x) => Err(OllamaError::bad(format!(
            "invalid 'options.{name}': {x} is not between {lo} and {hi}"
        ))),
    }
}

/// Sampling and stopping from `options` (the ranges are the OpenAI endpoints'), `format` and `stream`.
fn gen_settings(
    o: &Options,
    thinking: bool,
    format: Option<&Value>,
    stream: bool,
) -> Result<GenSettings, OllamaError> {
    let mut params = SamplingParams::qwen35(thinking);
    if let Some(t) = in_range("temperature", o.temperature, 0.0, 2.0)? {
        params.temperature = t;
    }
    if let Some(p) = in_range("top_p", o.top_p, 0.0, 1.0)? {
        params.top_p = p;
    }
    if let Some(p) = in_range("min_p", o.min_p, 0.0, 1.0)? {
        params.min_p = p;
    }
    if let Some(p) = in_range("repeat_penalty", o.repeat_penalty, 0.0, 10.0)? {
        params.repeat_penalty = p;
    }
    if let Some(p) = in_range("presence_penalty", o.presence_penalty, -2.0, 2.0)? {
        params.presence_penalty = p;
    }
    if let Some(p) = in_range("frequency_penalty", o.frequency_penalty, -2.0, 2.0)? {
        params.frequency_penalty = p;
    }
    match o.top_k {
        None => {}
        Some(k) if (0..=u32::MAX as i64).contains(&k) => params.top_k = k as usize,
        Some(k) => {
            return Err(OllamaError::bad(format!(
                "invalid 'options.top_k': {k} is negative or too large"
            )))
        }
    }
    match o.repeat_last_n {
        None => {}
        // -1: the whole context.
        Some(-1) => params.penalty_last_n = 1 << 20,
        Some(n) if (0..=1 << 20).contains(&n) => params.penalty_last_n = n as usize,
        Some(n) => {
            return Err(OllamaError::bad(format!(
                "invalid 'options.repeat_last_n': {n} (-1 for the whole context, or 0 to {})",
                1 << 20
            )))
        }
    }
    // Ollama's default seed is -1: a random one.
    params.seed = o.seed.and_then(|s| u64::try_from(s).ok());
    // The context is the server's (`deltaq serve -c`); a different num_ctx is accepted, and a prompt
    // longer than the server's context is refused with a clear error.
    if let Some(n) = o.num_ctx {
        if n < 1 {
            return Err(OllamaError::bad(format!(
                "invalid 'options.num_ctx': {n} (must be at least 1)"
            )));
        }
    }
    // -1 (and Ollama's 0): until the end; -2: until the context is full. Both end at the context.
    let max_tokens = match o.num_predict {
        None | Some(-2..=0) => None,
        Some(n) if n > 0 => Some(n.min(1 << 30) as usize),
        Some(n) => {
            return Err(OllamaError::bad(format!(
                "invalid 'options.num_predict': {n} (-1 for no limit, or a positive count)"
            )))
        }
    };
    let stop = match &o.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stop.len() > 16 || stop.iter().any(|s| s.len() > MAX_STOP_LEN) {
        return Err(OllamaError::bad(format!(
            "invalid 'options.stop': at most 16 strings of at most {MAX_STOP_LEN} bytes"
        )));
    }
    Ok(GenSettings {
        params,
        max_tokens,
        stop,
        stream,
        include_usage: false,
        ignore_eos: o.ignore_eos.unwrap_or(false),
        constraint: constraint(format)?,
    })
}

/// Base64 images (Ollama sends them without a data-URL prefix; one is tolerated).
fn decode_images(
    st: &AppState,
    images: &[String],
    field: &str,
    out: &mut Vec<Vec<u8>>,
) -> Result<usize, OllamaError> {
    if images.is_empty() {
        return Ok(0);
    }
    if st.images.is_none() {
        return Err(OllamaError::bad(format!(
            "invalid '{field}': this server takes no images (start it with --mmproj)"
        )));
    }
    for (j, b64) in images.iter().enumerate() {
        let data = match b64.split_once(";base64,") {
            Some((head, data)) if head.starts_with("data:") => data,
            _ => b64,
        };
        let bytes = decode_base64(data).map_err(|e| {
            OllamaError::bad(format!("invalid '{field}[{j}]': bad base64 data: {e}"))
        })?;
        out.push(bytes);
    }
    Ok(images.len())
}

/// One message as a template value; its images' bytes go to `images` (their markers lead the content).
fn message_value(
    st: &AppState,
    i: usize,
    m: &Message,
    images: &mut Vec<Vec<u8>>,
) -> Result<JValue, OllamaError> {
    let role = match m.role.as_str() {
        r @ ("system" | "user" | "assistant" | "tool") => r,
        other => {
            return Err(OllamaError::bad(format!(
                "invalid 'messages[{i}].role': '{other}' (system, user, assistant or tool)"
            )))
        }
    };
    let mut content = String::new();
    if let Some(list) = &m.images {
        if role != "user" && !list.is_empty() {
            return Err(OllamaError::bad(format!(
                "invalid 'messages[{i}].images': only user messages carry images"
            )));
        }
        let n = decode_images(st, list, &format!("messages[{i}].images"), images)?;
        content.push_str(&MEDIA_MARKER.repeat(n));
    }
    content.push_str(m.content.as_deref().unwrap_or(""));
    let mut v = json!({"role": role, "content": content});
    if role == "assistant" {
        if let Some(t) = m.thinking.as_deref().filter(|t| !t.is_empty()) {
            v["reasoning_content"] = json!(t);
        }
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    json!({"type": "function", "function": {
                        "name": c.function.name,
                        "arguments": c.function.arguments.clone().unwrap_or_default(),
                    }})
                })
                .collect();
            v["tool_calls"] = Value::Array(calls);
        }
    } else if m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(OllamaError::bad(format!(
            "invalid 'messages[{i}].tool_calls': only assistant messages carry tool calls"
        )));
    }
    Ok(to_jinja(&v))
}

// ---------------------------------------------------------------------------------------------
// Chat and generate

/// A prepared request: a generation, or (no messages / no prompt) Ollama's "load" answer.
enum Prep {
    Load {
        model: String,
    },
    Generate {
        model: String,
        prepared: Box<Prepared>,
        /// `None` (raw generate): the output is all response, no thinking split.
        split: Option<ChatStream>,
    },
}

fn prepare_chat(st: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Prep, OllamaError> {
    let req: ChatRequest = parse(body)?;
    let model = resolve_model(st, req.model.as_deref())?;
    let think = thinking(req.think.as_ref(), st.default_thinking)?;
    let settings = gen_settings(
        &req.options.unwrap_or_default(),
        think,
        req.format.as_ref(),
        req.stream.unwrap_or(true),
    )?;
    check_format(st, &settings)?;
    let _ = req.keep_alive;
    if req.messages.is_empty() {
        return Ok(Prep::Load { model });
    }
    chat_template(st)?;
    let mut images = Vec::new();
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| message_value(st, i, m, &mut images))
        .collect::<Result<Vec<_>, _>>()?;
    let mut extra = Vec::new();
    let tools = req.tools.unwrap_or_default();
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(OllamaError::bad(format!(
                "invalid 'tools[{i}].type': '{}' (only \"function\")",
                t.kind
            )));
        }
        if t.function.name.is_empty() {
            return Err(OllamaError::bad(format!(
                "invalid 'tools[{i}].function.name': empty"
            )));
        }
    }
    let use_tools = !tools.is_empty();
    if use_tools {
        let v = serde_json::to_value(&tools).map_err(|e| OllamaError::bad(e.to_string()))?;
        extra.push(("tools".to_string(), to_jinja(&v)));
    }
    let ChatPrompt {
        prompt,
        checkpoints,
        started_in_think,
    } = render_chat(st, messages, &images, think, extra)?;
    Ok(Prep::Generate {
        model,
        prepared: Box::new(Prepared {
            prompt,
            checkpoints,
            settings,
            logprobs: None,
            special: true,
            cache_output: false,
        }),
        split: Some(ChatStream::new(started_in_think, use_tools)),
    })
}

fn prepare_generate(
    st: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Prep, OllamaError> {
    let req: GenerateRequest = parse(body)?;
    let model = resolve_model(st, req.model.as_deref())?;
    let think = thinking(req.think.as_ref(), st.default_thinking)?;
    let settings = gen_settings(
        &req.options.unwrap_or_default(),
        think,
        req.format.as_ref(),
        req.stream.unwrap_or(true),
    )?;
    check_format(st, &settings)?;
    let _ = req.keep_alive;
    if req.template.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(OllamaError::bad(
            "a custom 'template' is not supported: the model's chat template is used (or send \"raw\": true with a formatted prompt)",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(OllamaError::bad(
            "'suffix' (fill in the middle) is not supported",
        ));
    }
    let prompt = req.prompt.unwrap_or_default();
    let image_list = req.images.unwrap_or_default();
    if prompt.is_empty() && image_list.is_empty() {
        return Ok(Prep::Load { model });
    }
    let raw = req.raw.unwrap_or(false);
    if raw {
        if !image_list.is_empty() {
            return Err(OllamaError::bad(
                "'images' need the chat template: they cannot be sent with \"raw\": true",
            ));
        }
        let ids = st
            .engine
            .tok
            .encode(&prompt, true)
            .map_err(|e| OllamaError::bad(format!("cannot tokenize: {e}")))?;
        check_context(ids.len(), st.engine.n_ctx)?;
        let prompt = Prompt::text(ids).map_err(|e| OllamaError::bad(format!("{e:#}")))?;
        return Ok(Prep::Generate {
            model,
            prepared: Box::new(Prepared {
                prompt,
                checkpoints: Vec::new(),
                settings,
                logprobs: None,
                special: false,
                cache_output: true,
            }),
            split: None,
        });
    }
    chat_template(st)?;
    let mut images = Vec::new();
    let n = decode_images(st, &image_list, "images", &mut images)?;
    let mut messages = Vec::new();
    if let Some(s) = req.system.as_deref().filter(|s| !s.is_empty()) {
        messages.push(to_jinja(&json!({"role": "system", "content": s})));
    }
    let content = MEDIA_MARKER.repeat(n) + &prompt;
    messages.push(to_jinja(&json!({"role": "user", "content": content})));
    let ChatPrompt {
        prompt,
        checkpoints,
        started_in_think,
    } = render_chat(st, messages, &images, think, Vec::new())?;
    Ok(Prep::Generate {
        model,
        prepared: Box::new(Prepared {
            prompt,
            checkpoints,
            settings,
            logprobs: None,
            special: true,
            cache_output: false,
        }),
        split: Some(ChatStream::new(started_in_think, false)),
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Generate,
}

pub async fn chat(
    State(st): St,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    respond(st, headers, body, Endpoint::Chat).await
}

pub async fn generate(
    State(st): St,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    respond(st, headers, body, Endpoint::Generate).await
}

async fn respond(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Result<Response, OllamaError> {
    let t0 = Instant::now();
    check_auth(&st, &headers)?;
    let st2 = st.clone();
    let prep = blocking(move || match endpoint {
        Endpoint::Chat => prepare_chat(&st2, body),
        Endpoint::Generate => prepare_generate(&st2, body),
    })
    .await?;
    let (model, mut prepared, split) = match prep {
        Prep::Load { model } => return Ok(json_response(&load_answer(&model, endpoint))),
        Prep::Generate {
            model,
            prepared,
            split,
        } => (model, prepared, split),
    };
    let rx = submit(&st, &mut prepared)?;
    let answer = Answer {
        model,
        endpoint,
        split,
        t0,
    };
    if prepared.settings.stream {
        Ok(ndjson(answer_stream(rx, answer)))
    } else {
        whole(rx, answer).await
    }
}

/// What a response needs while the generation runs.
struct Answer {
    model: String,
    endpoint: Endpoint,
    split: Option<ChatStream>,
    t0: Instant,
}

/// Text split into content and thinking.
#[derive(Default)]
struct Pieces {
    content: String,
    thinking: String,
}

impl Pieces {
    fn add(&mut self, ds: Vec<Delta>) {
        for d in ds {
            match d {
                Delta::Content(t) => self.content.push_str(&t),
                Delta::Reasoning(t) => self.thinking.push_str(&t),
            }
        }
    }
}

impl Answer {
    fn push(&mut self, text: &str) -> Pieces {
        let mut p = Pieces::default();
        match &mut self.split {
            Some(s) => p.add(s.push(text)),
            None => p.content.push_str(text),
        }
        p
    }

    fn finish(&mut self) -> (Pieces, Vec<ToolCall>) {
        let mut p = Pieces::default();
        match &mut self.split {
            Some(s) => {
                let (rest, calls) = s.finish();
                p.add(rest);
                (p, calls)
            }
            None => (p, Vec::new()),
        }
    }

    /// One answer object as a JSON line.
    fn line(&self, p: Pieces, calls: &[ToolCall], end: Option<Final>) -> String {
        let created_at = card::rfc3339(SystemTime::now());
        let thinking = Some(p.thinking).filter(|t| !t.is_empty());
        let done = end.is_some();
        match self.endpoint {
            Endpoint::Chat => ndjson_line(&ChatResponse {
                model: &self.model,
                created_at,
                message: OutMessage {
                    role: "assistant",
                    content: p.content,
                    thinking,
                    tool_calls: calls.iter().enumerate().map(tool_call_out).collect(),
                },
                done,
                end,
            }),
            Endpoint::Generate => ndjson_line(&GenerateResponse {
                model: &self.model,
                created_at,
                response: p.content,
                thinking,
                done,
                end,
            }),
        }
    }

    fn end(&self, d: &Done) -> Final {
        let ns = |ms: f64| (ms * 1e6).max(0.0) as u64;
        Final {
            done_reason: match d.finish {
                Finish::Length => "length",
                _ => "stop",
            },
            total_duration: self.t0.elapsed().as_nanos() as u64,
            // The model is loaded once at startup.
            load_duration: 0,
            // The whole prompt, cached tokens included (as OpenAI's usage counts it): clients take this
            // as the request's prompt size, and a fully cached prompt would otherwise count 0.
            prompt_eval_count: d.prompt_tokens,
            prompt_eval_duration: ns(d.prompt_ms),
            eval_count: d.completion_tokens,
            eval_duration: ns(d.gen_ms),
        }
    }
}

fn tool_call_out((index, c): (usize, &ToolCall)) -> ToolCallOut {
    // Ollama's arguments are an object; text.rs gives them as a JSON object string.
    let arguments = serde_json::from_str::<Value>(&c.arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    ToolCallOut {
        function: ToolCallFunctionOut {
            index,
            name: c.name.clone(),
            arguments,
        },
    }
}

fn ndjson_line<T: Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string(v).unwrap_or_default();
    s.push('\n');
    s
}

fn json_response(line: &str) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        )],
        line.to_string(),
    )
        .into_response()
}

fn load_answer(model: &str, endpoint: Endpoint) -> String {
    let created_at = card::rfc3339(SystemTime::now());
    match endpoint {
        Endpoint::Chat => ndjson_line(&ChatLoad {
            model,
            created_at,
            message: OutMessage {
                role: "assistant",
                content: String::new(),
                thinking: None,
                tool_calls: Vec::new(),
            },
            done: true,
            done_reason: "load",
        }),
        Endpoint::Generate => ndjson_line(&GenerateLoad {
            model,
            created_at,
            response: String::new(),
            done: true,
            done_reason: "load",
        }),
    }
}

async fn whole(
    mut rx: UnboundedReceiver<Event>,
    mut answer: Answer,
) -> Result<Response, OllamaError> {
    let mut all = Pieces::default();
    let (done, _) = collect(&mut rx, |t| {
        let p = answer.push(&t);
        all.content.push_str(&p.content);
        all.thinking.push_str(&p.thinking);
    })
    .await?;
    let (rest, calls) = answer.finish();
    all.content.push_str(&rest.content);
    all.thinking.push_str(&rest.thinking);
    all.thinking = all.thinking.trim_end_matches('\n').to_string();
    let end = answer.end(&done);
    Ok(json_response(&answer.line(all, &calls, Some(end))))
}

fn ndjson(stream: impl futures_util::Stream<Item = String> + Send + 'static) -> Response {
    use futures_util::StreamExt;
    let body = Body::from_stream(stream.map(|s| Ok::<_, std::convert::Infallible>(Bytes::from(s))));
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

/// The streamed answer: one object per generated piece, then the final one (tool calls, if any, in
/// the object before it). Dropping it (the client went away) drops the receiver, which cancels the
/// generation.
fn answer_stream(
    rx: UnboundedReceiver<Event>,
    answer: Answer,
) -> impl futures_util::Stream<Item = String> + Send + 'static {
    struct S {
        rx: UnboundedReceiver<Event>,
        answer: Answer,
        ended: bool,
    }
    let s = S {
        rx,
        answer,
        ended: false,
    };
    futures_util::stream::unfold(s, |mut s| async move {
        if s.ended {
            return None;
        }
        loop {
            let out = match s.rx.recv().await {
                Some(Event::Text { text, .. }) => {
                    let p = s.answer.push(&text);
                    if p.content.is_empty() && p.thinking.is_empty() {
                        continue;
                    }
                    s.answer.line(p, &[], None)
                }
                Some(Event::Done(d)) => {
                    s.ended = true;
                    if d.finish == Finish::Cancelled {
                        OllamaError::from(super::api::cancelled_error()).line()
                    } else {
                        let (rest, calls) = s.answer.finish();
                        let mut out = String::new();
                        if !rest.content.is_empty()
                            || !rest.thinking.is_empty()
                            || !calls.is_empty()
                        {
                            out += &s.answer.line(rest, &calls, None);
                        }
                        let end = s.answer.end(&d);
                        out + &s.answer.line(Pieces::default(), &[], Some(end))
                    }
                }
                Some(Event::Error(e)) => {
                    s.ended = true;
                    OllamaError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("generation failed: {e}"),
                    )
                    .line()
                }
                None => {
                    s.ended = true;
                    OllamaError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "generation failed: the generation ended early",
                    )
                    .line()
                }
            };
            return Some((out, s));
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Model information

pub async fn tags(State(st): St, headers: HeaderMap) -> Result<Response, OllamaError> {
    check_auth(&st, &headers)?;
    let name = listed_name(&st.model_id);
    let c = &st.ollama;
    Ok(json_response(&ndjson_line(&TagsResponse {
        models: vec![ListedModel {
            name: &name,
            model: &name,
            modified_at: &c.modified_at,
            size: c.size,
            details: &c.details,
        }],
    })))
}

pub async fn ps(State(st): St, headers: HeaderMap) -> Result<Response, OllamaError> {
    check_auth(&st, &headers)?;
    let name = listed_name(&st.model_id);
    let c = &st.ollama;
    // The model stays loaded for the server's life: the expiry is as far off as Ollama's "forever".
    let expires = card::rfc3339(SystemTime::now() + Duration::from_secs(100 * 365 * 86_400));
    Ok(json_response(&ndjson_line(&PsResponse {
        models: vec![RunningModel {
            name: &name,
            model: &name,
            size: c.size,
            details: &c.details,
            expires_at: &expires,
            size_vram: 0,
            context_length: st.engine.n_ctx,
        }],
    })))
}

pub async fn show(
    State(st): St,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    check_auth(&st, &headers)?;
    let req: ShowRequest = parse(body)?;
    resolve_model(&st, req.model.as_deref().or(req.name.as_deref()))?;
    let c = &st.ollama;
    let mut capabilities = vec!["completion"];
    if c.template.contains("tools") {
        capabilities.push("tools");
    }
    if c.template.contains("<think>") {
        capabilities.push("thinking");
    }
    if st.images.is_some() {
        capabilities.push("vision");
    }
    let p = SamplingParams::qwen35(st.default_thinking);
    let parameters = format!(
        "temperature {}\ntop_k {}\ntop_p {}\nmin_p {}\npresence_penalty {}\nrepeat_penalty {}\nnum_ctx {}",
        p.temperature,
        p.top_k,
        p.top_p,
        p.min_p,
        p.presence_penalty,
        p.repeat_penalty,
        st.engine.n_ctx
    );
    Ok(json_response(&ndjson_line(&ShowResponse {
        license: &c.license,
        modelfile: format!(
            "# served by deltaq\nFROM {}\n{}\n",
            c.file_name,
            parameters
                .lines()
                .map(|l| format!("PARAMETER {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
        parameters,
        template: &c.template,
        details: &c.details,
        model_info: &c.model_info,
        capabilities,
        modified_at: &c.modified_at,
    })))
}

pub async fn version() -> Response {
    json_response(&ndjson_line(&VersionResponse {
        version: OLLAMA_VERSION,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(split: Option<ChatStream>) -> Answer {
        Answer {
            model: "m".into(),
            endpoint: Endpoint::Chat,
            split,
            t0: Instant::now(),
        }
    }

    #[test]
    fn tool_calls_in_ollamas_shape() {
        let mut a = answer(Some(ChatStream::new(false, true)));
        let mut text = a.push("Let me look.\n").content;
        text += &a
            .push("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n")
            .content;
        text += &a.push("</function>\n</tool_call>").content;
        let (rest, calls) = a.finish();
        assert_eq!((text + &rest.content).trim(), "Let me look.");
        let v: Value = serde_json::from_str(&a.line(Pieces::default(), &calls, None)).unwrap();
        assert_eq!(
            v["message"]["tool_calls"],
            json!([{"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}])
        );
        assert_eq!(v["done"], false);
        assert!(v.get("done_reason").is_none());
    }

    #[test]
    fn thinking_apart_and_raw_untouched() {
        let mut a = answer(Some(ChatStream::new(true, false)));
        let mut p = a.push("Moses led Israel.</think>\n\nHe was a prophet.");
        let (rest, _) = a.finish();
        p.content += &rest.content;
        assert_eq!(p.thinking.trim(), "Moses led Israel.");
        assert_eq!(p.content.trim(), "He was a prophet.");
        let mut raw = answer(None);
        let p = raw.push("a</think>b");
        assert_eq!(
            (p.content.as_str(), p.thinking.as_str()),
            ("a</think>b", "")
        );
    }

    #[test]
    fn format_and_think_values() {
        assert!(matches!(
            constraint(Some(&json!("json"))).unwrap(),
            Some(OutputConstraint::JsonObject)
        ));
        assert!(matches!(
            constraint(Some(&json!({"type": "object"}))).unwrap(),
            Some(OutputConstraint::JsonSchema(_))
        ));
        assert!(constraint(Some(&json!(""))).unwrap().is_none());
        assert!(constraint(Some(&json!("xml"))).is_err());
        assert!(constraint(Some(&json!(true))).is_err());
        assert!(thinking(Some(&json!("high")), false).unwrap());
        assert!(!thinking(Some(&json!(false)), true).unwrap());
        assert!(thinking(None, true).unwrap());
        assert!(thinking(Some(&json!("max")), true).is_err());
    }
}
