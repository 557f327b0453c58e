//! The HTTP handlers: request validation (every error in the OpenAI shape, nothing from a request is
//! unwrapped), prompt building, and the responses, streamed as server-sent events or whole.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use minijinja::value::Value as JValue;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::engine::{Done, Engine, Event, Finish, Job, TokenLogprob};
use super::text::{tool_call_json, ChatStream, Delta};
use super::AppState;
use crate::chat::{ChatOptions, ChatTemplate};
use crate::constraint::tools::{ToolCalls, ToolSpec};
use crate::constraint::{ConstraintError, OutputConstraint};
use crate::model::prompt::{prompt_with_media, MEDIA_MARKER};
use crate::model::Prompt;
use crate::sampling::SamplingParams;
use crate::vision::tower::VisionScratch;

type St = State<Arc<AppState>>;

// ---------------------------------------------------------------------------------------------
// Errors

/// An error response: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
    retry_after: Option<u32>,
}

impl ApiError {
    pub(super) fn new(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub(super) fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub(super) fn param(message: impl Into<String>, param: &str) -> ApiError {
        let mut e = ApiError::invalid(message);
        e.param = Some(param.to_string());
        e
    }

    pub(super) fn code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub(super) fn status(&self) -> StatusCode {
        self.status
    }

    pub(super) fn message(&self) -> &str {
        &self.message
    }

    pub(super) fn retry_after(&self) -> Option<u32> {
        self.retry_after
    }

    fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, json_body(&self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body was never read: say so, rather than let a client reuse the connection.
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }
}

fn json_body(v: &Value) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        v.to_string(),
    )
        .into_response()
}

/// The body is read (and dropped) so the connection stays usable: hyper closes a keep-alive connection
/// whose request body was left unread, and a client that pooled it fails its next request.
pub async fn not_found(_body: Result<Bytes, BytesRejection>) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "no such endpoint").code("not_found")
}

/// Reads the body for the same reason as [`not_found`].
pub async fn method_not_allowed(_body: Result<Bytes, BytesRejection>) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method not allowed on this endpoint",
    )
    .code("method_not_allowed")
}

fn busy() -> ApiError {
    let mut e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_busy",
        "all sessions are busy and the queue is full; retry later",
    )
    .code("queue_full");
    e.retry_after = Some(1);
    e
}

// ---------------------------------------------------------------------------------------------
// Request plumbing

/// Constant-time comparison (the time depends on the lengths only).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    let n = a.len().max(b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= (x ^ y) as u64;
    }
    std::hint::black_box(diff) == 0
}

pub(super) fn check_auth(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &st.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .unwrap_or("");
    if ct_eq(given.trim().as_bytes(), key.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid or missing API key (Authorization: Bearer KEY)",
        )
        .code("invalid_api_key"))
    }
}

/// The body as a JSON object (413 past the size limit, 400 for anything but a JSON object).
fn parse_body(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, ApiError> {
    let bytes = body.map_err(|r| {
        let status = r.status();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request body too large".to_string()
        } else {
            format!("cannot read the request body: {}", r.body_text())
        };
        ApiError::new(status, "invalid_request_error", msg).code(
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                "request_too_large"
            } else {
                "invalid_body"
            },
        )
    })?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::invalid(format!("the request body is not valid JSON: {e}")).code("invalid_json")
    })?;
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::invalid("the request body must be a JSON object").code("invalid_json")),
    }
}

/// Typed access to a request object's fields; wrong types are 400s naming the field.
pub(super) struct Fields<'a> {
    pub(super) m: &'a Map<String, Value>,
    pub(super) prefix: &'a str,
}

impl<'a> Fields<'a> {
    fn new(m: &'a Map<String, Value>) -> Fields<'a> {
        Fields { m, prefix: "" }
    }

    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.m.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, what: &str) -> ApiError {
        ApiError::param(
            format!("'{}' must be {what}", self.name(key)),
            &self.name(key),
        )
    }

    fn f32_in(&self, key: &str, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x >= lo as f64 && x <= hi as f64 => Ok(Some(x as f32)),
                _ => Err(self.wrong(key, &format!("a number between {lo} and {hi}"))),
            },
        }
    }

    fn uint(&self, key: &str, max: u64) -> Result<Option<u64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(x) if x <= max => Ok(Some(x)),
                _ => Err(self.wrong(key, &format!("an integer between 0 and {max}"))),
            },
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.wrong(key, "a boolean")),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong(key, "a string")),
        }
    }

    fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(_) => Err(self.wrong(key, "an object")),
        }
    }
}

fn check_model(st: &AppState, f: &Fields<'_>) -> Result<(), ApiError> {
    match f.str("model")? {
        None => Ok(()),
        Some(m) if m == st.model_id || m.is_empty() => Ok(()),
        Some(m) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "the model '{m}' does not exist; this server serves '{}'",
                st.model_id
            ),
        )
        .code("model_not_found")),
    }
    .map_err(|mut e| {
        e.param = Some("model".into());
        e
    })
}

/// Longest stop string (bytes): matching holds back and compares up to this much text per token.
pub(super) const MAX_STOP_LEN: usize = 512;

/// Sampling and stopping settings shared by both completion endpoints.
pub(super) struct GenSettings {
    pub(super) params: SamplingParams,
    pub(super) max_tokens: Option<usize>,
    pub(super) stop: Vec<String>,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    pub(super) ignore_eos: bool,
    /// The language the answer must follow (`response_format`, `grammar`, Ollama's `format`).
    pub(super) constraint: Option<OutputConstraint>,
}

fn gen_settings(
    f: &Fields<'_>,
    mut params: SamplingParams,
    engine: &Engine,
) -> Result<GenSettings, ApiError> {
    if let Some(t) = f.f32_in("temperature", 0.0, 2.0)? {
        params.temperature = t;
    }
    if let Some(p) = f.f32_in("top_p", 0.0, 1.0)? {
        params.top_p = p;
    }
    if let Some(k) = f.uint("top_k", u32::MAX as u64)? {
        params.top_k = k as usize;
    }
    if let Some(p) = f.f32_in("min_p", 0.0, 1.0)? {
        params.min_p = p;
    }
    if let Some(p) = f.f32_in("presence_penalty", -2.0, 2.0)? {
        params.presence_penalty = p;
    }
    if let Some(p) = f.f32_in("frequency_penalty", -2.0, 2.0)? {
        params.frequency_penalty = p;
    }
    if let Some(p) = f.f32_in("repeat_penalty", 0.0, 10.0)? {
        params.repeat_penalty = p;
    }
    if let Some(n) = f.uint("repeat_last_n", 1 << 20)? {
        params.penalty_last_n = n as usize;
    }
    params.seed = match f.get("seed") {
        None => None,
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => Some(u),
            (None, Some(i)) => Some(i as u64),
            _ => return Err(f.wrong("seed", "an integer")),
        },
    };
    let max_tokens = match f.uint("max_completion_tokens", 1 << 30)? {
        Some(n) => Some(n as usize),
        None => f.uint("max_tokens", 1 << 30)?.map(|n| n as usize),
    };
    if let Some(n) = f.uint("n", 1 << 30)? {
        if n != 1 {
            return Err(f.wrong("n", "1 (one choice per request is supported)"));
        }
    }
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) if s.len() <= MAX_STOP_LEN => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 16 => {
            let mut out = Vec::new();
            for v in a {
                match v {
                    Value::String(s) if s.len() <= MAX_STOP_LEN => out.push(s.clone()),
                    _ => {
                        return Err(f.wrong(
                            "stop",
                            "a string or an array of strings of at most 512 bytes",
                        ))
                    }
                }
            }
            out
        }
        Some(_) => {
            return Err(f.wrong(
                "stop",
                "a string or an array of at most 16 strings of at most 512 bytes",
            ))
        }
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(o) => Fields {
            m: o,
            prefix: "stream_options.",
        }
        .bool("include_usage")?
        .unwrap_or(false),
        None => false,
    };
    Ok(GenSettings {
        params,
        max_tokens,
        stop,
        stream,
        include_usage,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        constraint: output_constraint(f, engine)?,
    })
}

/// The request fields OpenAI checks that the settings above do not read or read leniently: 400s with
/// `param` for what OpenAI refuses. Fields this server does not know are let through (vendor
/// extensions).
fn check_openai_fields(f: &Fields<'_>, chat: bool, n_vocab: usize) -> Result<(), ApiError> {
    for key in ["max_tokens", "max_completion_tokens"] {
        if f.get(key).is_some_and(|v| v.as_u64() == Some(0)) {
            return Err(f.wrong(key, "at least 1"));
        }
    }
    if matches!(f.get("stop"), Some(Value::Array(a)) if a.len() > 4) {
        return Err(f.wrong("stop", "a string or an array of at most 4 strings"));
    }
    if let Some(bias) = f.object("logit_bias")? {
        for (k, v) in bias {
            let name = format!("logit_bias.{k}");
            if !k.parse::<u64>().is_ok_and(|id| id < n_vocab as u64) {
                return Err(ApiError::param(
                    format!("'logit_bias' keys must be token ids below {n_vocab}, not '{k}'"),
                    &name,
                ));
            }
            if !v.as_f64().is_some_and(|b| (-100.0..=100.0).contains(&b)) {
                return Err(ApiError::param(
                    format!("'{name}' must be a number between -100 and 100"),
                    &name,
                ));
            }
        }
        if !bias.is_empty() {
            return Err(ApiError::param(
                "'logit_bias' is not supported by this server",
                "logit_bias",
            ));
        }
    }
    if f.get("stream_options").is_some() && !f.bool("stream")?.unwrap_or(false) {
        return Err(ApiError::param(
            "'stream_options' is only allowed when 'stream' is true",
            "stream_options",
        ));
    }
    f.str("user")?;
    if !chat {
        return Ok(());
    }
    if f.get("top_logprobs").is_some() && !f.bool("logprobs")?.unwrap_or(false) {
        return Err(ApiError::param(
            "'top_logprobs' requires 'logprobs' to be true",
            "top_logprobs",
        ));
    }
    let mut names = Vec::new();
    if let Some(Value::Array(tools)) = f.get("tools") {
        for (i, t) in tools.iter().enumerate() {
            let tp = format!("tools[{i}]");
            if t.get("type").and_then(|x| x.as_str()) != Some("function") {
                return Err(ApiError::param(
                    format!("'{tp}.type' must be \"function\""),
                    &format!("{tp}.type"),
                ));
            }
            match t.get("function").and_then(|x| x.get("parameters")) {
                None | Some(Value::Null) | Some(Value::Object(_)) => {}
                Some(_) => {
                    return Err(ApiError::param(
                        format!("'{tp}.function.parameters' must be a JSON schema object"),
                        &format!("{tp}.function.parameters"),
                    ))
                }
            }
            if let Some(n) = t
                .get("function")
                .and_then(|x| x.get("name"))
                .and_then(|n| n.as_str())
            {
                names.push(n);
            }
        }
    }
    match f.get("tool_choice") {
        None => Ok(()),
        Some(Value::String(s)) if matches!(s.as_str(), "none" | "auto" | "required") => Ok(()),
        Some(Value::Object(o))
            if o.get("type").and_then(|t| t.as_str()) == Some("function")
                && o
                    .get("function")
                    .and_then(|x| x.get("name"))
                    .and_then(|n| n.as_str())
                    .is_some_and(|n| names.contains(&n)) =>
        {
            Ok(())
        }
        Some(_) => Err(f.wrong(
            "tool_choice",
            "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}} naming one of the tools",
        )),
    }
}

/// The language the output must follow: OpenAI's `response_format`, or llama.cpp's `json_schema` or
/// `grammar` (GBNF), at most one of them. Compiled here, so an unsupported schema feature or a bad
/// grammar is a 400 naming the field.
fn output_constraint(
    f: &Fields<'_>,
    engine: &Engine,
) -> Result<Option<OutputConstraint>, ApiError> {
    let mut asked: Vec<(String, OutputConstraint)> = Vec::new();
    if let Some(rf) = f.object("response_format")? {
        let rf = Fields {
            m: rf,
            prefix: "response_format.",
        };
        match rf.str("type")? {
            Some("text") => {}
            // llama.cpp's extension: a json_object with a schema.
            Some("json_object") => asked.push((
                f.name("response_format"),
                match rf.get("schema") {
                    Some(s) => OutputConstraint::JsonSchema(schema_value(&rf, "schema", s)?),
                    None => OutputConstraint::JsonObject,
                },
            )),
            Some("json_schema") => {
                let Some(js) = rf.object("json_schema")? else {
                    return Err(rf.wrong("json_schema", "an object with a 'schema'"));
                };
                let js = Fields {
                    m: js,
                    prefix: "response_format.json_schema.",
                };
                js.str("name")?;
                js.bool("strict")?;
                let Some(s) = js.get("schema") else {
                    return Err(js.wrong("schema", "a JSON schema"));
                };
                asked.push((
                    f.name("response_format"),
                    OutputConstraint::JsonSchema(schema_value(&js, "schema", s)?),
                ));
            }
            _ => {
                return Err(rf.wrong("type", "one of 'text', 'json_object' and 'json_schema'"));
            }
        }
    }
    if let Some(s) = f.get("json_schema") {
        asked.push((
            f.name("json_schema"),
            OutputConstraint::JsonSchema(schema_value(f, "json_schema", s)?),
        ));
    }
    // llama.cpp clients send an empty grammar for "none".
    if let Some(g) = f.str("grammar")?.filter(|g| !g.trim().is_empty()) {
        asked.push((f.name("grammar"), OutputConstraint::Grammar(g.to_string())));
    }
    let Some((param, c)) = asked.pop() else {
        return Ok(None);
    };
    if let Some((other, _)) = asked.first() {
        return Err(ApiError::param(
            format!("'{other}' and '{param}' both constrain the output: give one of them"),
            &param,
        ));
    }
    checked(engine, c, &param).map(Some)
}

/// The constraint if it compiles; a 400 naming `param` if not.
fn checked(
    engine: &Engine,
    c: OutputConstraint,
    param: &str,
) -> Result<OutputConstraint, ApiError> {
    match engine.compile_constraint(&c) {
        Ok(_) => Ok(c),
        Err(ConstraintError::Unavailable(msg)) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            msg,
        )),
        Err(e) => Err(ApiError::param(e.to_string(), param).code("invalid_constraint")),
    }
}

/// `tools` with `"strict": true`: the answer is text, or text then tool calls whose arguments follow
/// their function's schema (calls only with `tool_choice` "required" or a named function). Strict
/// tools constrain the whole answer, so they do not combine with another constraint.
fn strict_tools(
    f: &Fields<'_>,
    tools: &[Value],
    other: Option<OutputConstraint>,
    engine: &Engine,
) -> Result<Option<OutputConstraint>, ApiError> {
    let strict = |t: &Value| t["function"]["strict"] == Value::Bool(true);
    if !tools.iter().any(strict) {
        return Ok(other);
    }
    if other.is_some() {
        return Err(ApiError::param(
            "strict tools constrain the answer: they cannot be combined with response_format, json_schema or grammar",
            "tools",
        ));
    }
    let (required, only) = match f.get("tool_choice") {
        None => (false, None),
        Some(Value::String(s)) if s == "auto" => (false, None),
        Some(Value::String(s)) if s == "required" => (true, None),
        Some(Value::Object(o)) => match o.get("function").and_then(|x| x.get("name")) {
            Some(Value::String(n)) => (true, Some(n.as_str())),
            _ => {
                return Err(f.wrong(
                    "tool_choice",
                    "{\"type\": \"function\", \"function\": {\"name\": …}}",
                ))
            }
        },
        Some(_) => {
            return Err(f.wrong(
                "tool_choice",
                "'auto', 'none', 'required' or a function to call",
            ))
        }
    };
    let specs: Vec<ToolSpec> = tools
        .iter()
        .filter_map(|t| {
            let name = t["function"]["name"].as_str()?;
            if only.is_some_and(|o| o != name) {
                return None;
            }
            let parameters = match t["function"].get("parameters") {
                Some(p) if strict(t) && !p.is_null() => p.clone(),
                _ => json!({"type": "object"}),
            };
            Some(ToolSpec {
                name: name.to_string(),
                parameters,
            })
        })
        .collect();
    if specs.is_empty() {
        return Err(ApiError::param(
            "'tool_choice' names a function that is not in 'tools'",
            "tool_choice",
        ));
    }
    let c = OutputConstraint::ToolCalls(ToolCalls {
        tools: specs,
        required,
    });
    checked(engine, c, "tools").map(Some)
}

/// A JSON schema field: an object (or `true`/`false`).
fn schema_value(f: &Fields<'_>, key: &str, v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        _ => Err(f.wrong(key, "a JSON schema (an object)")),
    }
}

pub(super) fn check_context(n_prompt: usize, n_ctx: usize) -> Result<(), ApiError> {
    if n_prompt == 0 {
        return Err(ApiError::param("the prompt is empty", "prompt").code("empty_prompt"));
    }
    if n_prompt > n_ctx {
        return Err(ApiError::invalid(format!(
            "the prompt has {n_prompt} tokens, more than the context size of {n_ctx} tokens"
        ))
        .code("context_length_exceeded"));
    }
    Ok(())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(super) fn new_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}{:08x}{:04x}",
        now_secs(),
        nanos,
        N.fetch_add(1, Ordering::Relaxed) & 0xffff
    )
}

/// serde_json → template value.
pub(super) fn to_jinja(v: &Value) -> JValue {
    match v {
        Value::Null => JValue::from(()),
        Value::Bool(b) => JValue::from(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => JValue::from(i),
            (None, Some(u), _) => JValue::from(u),
            (_, _, Some(f)) => JValue::from(f),
            _ => JValue::from(()),
        },
        Value::String(s) => JValue::from(s.as_str()),
        Value::Array(a) => JValue::from(a.iter().map(to_jinja).collect::<Vec<_>>()),
        Value::Object(o) => JValue::from(
            o.iter()
                .map(|(k, v)| (k.clone(), to_jinja(v)))
                .collect::<BTreeMap<_, _>>(),
        ),
    }
}

fn usage_json(d: &Done) -> Value {
    json!({
        "prompt_tokens": d.prompt_tokens,
        "completion_tokens": d.completion_tokens,
        "total_tokens": d.prompt_tokens + d.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": d.cached_tokens},
    })
}

fn timings_json(d: &Done) -> Value {
    let mut t = json!({
        "cached_n": d.cached_tokens,
        "prompt_n": d.prompt_tokens - d.cached_tokens,
        "prompt_ms": d.prompt_ms,
        "predicted_n": d.completion_tokens,
        "predicted_ms": d.gen_ms,
    });
    // llama.cpp's names, present when the server drafts.
    if let Some(s) = d.draft {
        t["draft_n"] = json!(s.proposed);
        t["draft_n_accepted"] = json!(s.accepted);
    }
    t
}

// ---------------------------------------------------------------------------------------------
// Simple endpoints

pub async fn health(State(st): St) -> Response {
    let e = &st.engine;
    let c = &e.counters;
    let cache = e.cache_stats();
    let stopping = e.stopping.load(Ordering::Relaxed);
    let body = json!({
        "status": if stopping { "stopping" } else { "ok" },
        "model": st.model_id,
        "n_ctx": e.n_ctx,
        "kv_type": e.kv_type.name(),
        "images": st.images.is_some(),
        "uptime_s": st.started.elapsed().as_secs(),
        "slots": {"total": e.parallel, "busy": c.busy.load(Ordering::SeqCst)},
        "queue": {"capacity": e.queue_capacity, "waiting": c.waiting.load(Ordering::SeqCst)},
        "requests": {
            "completed": c.completed.load(Ordering::Relaxed),
            "cancelled": c.cancelled.load(Ordering::Relaxed),
            "rejected": c.rejected.load(Ordering::Relaxed),
            "failed": c.failed.load(Ordering::Relaxed),
        },
        "tokens": {
            "prompt_processed": c.prompt_tokens_processed.load(Ordering::Relaxed),
            "prompt_cached": c.prompt_tokens_cached.load(Ordering::Relaxed),
            "generated": c.generated_tokens.load(Ordering::Relaxed),
        },
        "cache": {
            "entries": cache.entries,
            "bytes": cache.bytes,
            "capacity_bytes": cache.capacity_bytes,
            "hits": cache.hits,
            "misses": cache.misses,
            "hit_tokens": cache.hit_tokens,
            "evictions": cache.evictions,
        },
    });
    let status = if stopping {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (status, json_body(&body)).into_response()
}

pub async fn models(State(st): St, headers: HeaderMap) -> Result<Response, ApiError> {
    check_auth(&st, &headers)?;
    let e = &st.engine;
    Ok(json_body(&json!({
        "object": "list",
        "data": [{
            "id": st.model_id,
            "object": "model",
            "created": st.created,
            "owned_by": "deltaq",
            "meta": {
                "n_ctx": e.n_ctx,
                "n_ctx_train": e.model.hp.n_ctx_train,
                "n_vocab": e.model.n_vocab(),
                "n_embd": e.model.hp.n_embd,
            },
        }],
    })))
}

pub async fn tokenize(
    State(st): St,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_auth(&st, &headers)?;
    blocking(move || tokenize_sync(&st, body)).await
}

fn tokenize_sync(st: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let m = parse_body(body)?;
    let f = Fields::new(&m);
    let content = f
        .str("content")?
        .ok_or_else(|| ApiError::param("'content' (a string) is required", "content"))?;
    let add_special = f.bool("add_special")?.unwrap_or(false);
    let parse_special = f.bool("parse_special")?.unwrap_or(true);
    let with_pieces = f.bool("with_pieces")?.unwrap_or(false);
    let tok = st.engine.tok;
    let ids = tok
        .encode_with(content, add_special, parse_special)
        .map_err(|e| ApiError::invalid(format!("cannot tokenize: {e}")))?;
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let piece = tok.token_to_piece(id, true);
                let p = match std::str::from_utf8(&piece) {
                    Ok(s) => json!(s),
                    Err(_) => json!(piece),
                };
                json!({"id": id, "piece": p})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(json_body(&json!({ "tokens": tokens })))
}

pub async fn detokenize(
    State(st): St,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_auth(&st, &headers)?;
    let m = parse_body(body)?;
    let f = Fields::new(&m);
    let n_vocab = st.engine.tok.n_vocab();
    let ids: Vec<u32> = match f.get("tokens") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&x| x < n_vocab as u64)
                    .map(|x| x as u32)
                    .ok_or_else(|| {
                        ApiError::param(
                            format!("'tokens' must hold token ids below {n_vocab}"),
                            "tokens",
                        )
                    })
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(ApiError::param(
                "'tokens' (an array of ids) is required",
                "tokens",
            ))
        }
    };
    let content = st.engine.tok.decode(&ids, true);
    Ok(json_body(&json!({ "content": content })))
}

// ---------------------------------------------------------------------------------------------
// Completions

/// A prepared generation: the job (without its channel) and what the response needs.
pub(super) struct Prepared {
    pub(super) prompt: Prompt,
    pub(super) checkpoints: Vec<usize>,
    pub(super) settings: GenSettings,
    pub(super) logprobs: Option<usize>,
    pub(super) special: bool,
    pub(super) cache_output: bool,
}

pub(super) fn submit(
    st: &AppState,
    p: &mut Prepared,
) -> Result<UnboundedReceiver<Event>, ApiError> {
    if st.engine.stopping.load(Ordering::Relaxed) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is shutting down",
        )
        .code("shutting_down"));
    }
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt: std::mem::replace(
            &mut p.prompt,
            Prompt::text(Vec::new()).expect("empty prompt"),
        ),
        checkpoints: std::mem::take(&mut p.checkpoints),
        params: p.settings.params.clone(),
        max_tokens: p.settings.max_tokens,
        stop: p.settings.stop.clone(),
        special: p.special,
        logprobs: p.logprobs,
        ignore_eos: p.settings.ignore_eos,
        constraint: p.settings.constraint.clone(),
        cache_output: p.cache_output,
        tx,
    };
    st.engine.submit(job).map_err(|_| busy())?;
    Ok(rx)
}

fn generation_failed(msg: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        format!("generation failed: {msg}"),
    )
}

pub(super) fn cancelled_error() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "the request was cancelled: the server is shutting down",
    )
    .code("shutting_down")
}

fn sse(stream: impl futures_util::Stream<Item = String> + Send + 'static) -> Response {
    use futures_util::StreamExt;
    let body = Body::from_stream(stream.map(|s| Ok::<_, Infallible>(Bytes::from(s))));
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

fn sse_event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

const SSE_DONE: &str = "data: [DONE]\n\n";

/// The end of a stream that stopped without finishing: the error as an event, then `[DONE]`.
fn sse_abort(e: ApiError) -> String {
    sse_event(&e.body()) + SSE_DONE
}

/// The end of a finished stream: `last` (the chunk with the finish reason) with usage and timings,
/// then, if the client asked for it (`stream_options.include_usage`), `usage_only` with no choices and
/// the usage, then `[DONE]`.
fn sse_finish(mut last: Value, mut usage_only: Value, d: &Done, include_usage: bool) -> String {
    last["usage"] = usage_json(d);
    last["timings"] = timings_json(d);
    let mut out = sse_event(&last);
    if include_usage {
        usage_only["choices"] = json!([]);
        usage_only["usage"] = usage_json(d);
        out += &sse_event(&usage_only);
    }
    out + SSE_DONE
}

/// The error for an event that ends a generation other than `Done`: a failure, or the channel closing
/// before `Done` arrived.
fn ended_without_done(error: Option<String>) -> ApiError {
    generation_failed(error.unwrap_or_else(|| "the generation ended early".into()))
}

/// What a stream sends for an event that ends it other than `Done`.
fn sse_early_end(error: Option<String>) -> String {
    sse_abort(ended_without_done(error))
}

/// A whole (non-streamed) generation: every text piece goes to `on_text`; returns `Done` and the
/// log-probabilities of all tokens, or the error that ended it (a cancellation included).
pub(super) async fn collect(
    rx: &mut UnboundedReceiver<Event>,
    mut on_text: impl FnMut(String),
) -> Result<(Done, Vec<TokenLogprob>), ApiError> {
    let mut lps = Vec::new();
    let done = loop {
        match rx.recv().await {
            Some(Event::Text { text, logprobs }) => {
                on_text(text);
                lps.extend(logprobs);
            }
            Some(Event::Done(d)) => break d,
            Some(Event::Error(e)) => return Err(ended_without_done(Some(e))),
            None => return Err(ended_without_done(None)),
        }
    };
    if done.finish == Finish::Cancelled {
        return Err(cancelled_error());
    }
    Ok((done, lps))
}

fn finish_reason(f: Finish, tool_calls: bool) -> &'static str {
    match (f, tool_calls) {
        (_, true) => "tool_calls",
        (Finish::Length, _) => "length",
        _ => "stop",
    }
}

pub async fn completions(
    State(st): St,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_auth(&st, &headers)?;
    let st2 = st.clone();
    let mut p = blocking(move || prepare_completion(&st2, body)).await?;
    let rx = submit(&st, &mut p)?;
    let id = new_id("cmpl");
    let meta = Meta {
        id,
        model: st.model_id.clone(),
        created: now_secs(),
    };
    if p.settings.stream {
        Ok(sse(completion_stream(
            rx,
            meta,
            p.settings.include_usage,
            st,
        )))
    } else {
        completion_whole(rx, meta, st).await
    }
}

fn prepare_completion(
    st: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Prepared, ApiError> {
    let m = parse_body(body)?;
    let f = Fields::new(&m);
    check_model(st, &f)?;
    check_openai_fields(&f, false, st.engine.tok.n_vocab())?;
    let tok = st.engine.tok;
    let bad_prompt = || {
        ApiError::param(
            "'prompt' must be a string, an array of one string, or an array of token ids",
            "prompt",
        )
    };
    let prompt: Vec<u32> = match f.get("prompt") {
        Some(Value::String(s)) => tok
            .encode(s, true)
            .map_err(|e| ApiError::invalid(format!("cannot tokenize: {e}")))?,
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => tok
            .encode(a[0].as_str().unwrap_or_default(), true)
            .map_err(|e| ApiError::invalid(format!("cannot tokenize: {e}")))?,
        Some(Value::Array(a)) if a.iter().all(|v| v.is_u64()) => {
            let n_vocab = tok.n_vocab() as u64;
            a.iter()
                .map(|v| {
                    v.as_u64()
                        .filter(|&x| x < n_vocab)
                        .map(|x| x as u32)
                        .ok_or_else(bad_prompt)
                })
                .collect::<Result<_, _>>()?
        }
        None => return Err(ApiError::param("'prompt' is required", "prompt")),
        Some(_) => return Err(bad_prompt()),
    };
    if f.get("suffix").is_some() {
        return Err(ApiError::param("'suffix' is not supported", "suffix"));
    }
    if f.bool("echo")?.unwrap_or(false) {
        return Err(ApiError::param("'echo' is not supported", "echo"));
    }
    let mut params = SamplingParams::qwen35(true);
    // Continuing text: the chat defaults' presence penalty is meant for instruct use.
    params.presence_penalty = 0.0;
    let settings = gen_settings(&f, params, &st.engine)?;
    let logprobs = f.uint("logprobs", 20)?.map(|n| n as usize);
    check_context(prompt.len(), st.engine.n_ctx)?;
    let prompt = Prompt::text(prompt).map_err(|e| ApiError::invalid(format!("{e:#}")))?;
    Ok(Prepared {
        prompt,
        checkpoints: Vec::new(),
        settings,
        logprobs,
        special: false,
        cache_output: true,
    })
}

struct Meta {
    id: String,
    model: String,
    created: u64,
}

fn completion_logprobs(st: &AppState, lps: &[TokenLogprob], offset: &mut usize) -> Value {
    let tok = st.engine.tok;
    let piece = |id: u32| String::from_utf8_lossy(&tok.token_to_piece(id, false)).into_owned();
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for lp in lps {
        let t = piece(lp.id);
        offsets.push(*offset);
        *offset += t.len();
        tokens.push(json!(t));
        token_logprobs.push(json!(lp.logprob));
        let mut m = Map::new();
        for &(i, l) in &lp.top {
            m.insert(piece(i), json!(l));
        }
        top.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

async fn completion_whole(
    mut rx: UnboundedReceiver<Event>,
    meta: Meta,
    st: Arc<AppState>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let (done, lps) = collect(&mut rx, |t| text.push_str(&t)).await?;
    let mut offset = 0;
    let logprobs = if lps.is_empty() {
        Value::Null
    } else {
        completion_logprobs(&st, &lps, &mut offset)
    };
    Ok(json_body(&json!({
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish_reason(done.finish, false),
        }],
        "usage": usage_json(&done),
        "timings": timings_json(&done),
    })))
}

fn completion_stream(
    rx: UnboundedReceiver<Event>,
    meta: Meta,
    include_usage: bool,
    st: Arc<AppState>,
) -> impl futures_util::Stream<Item = String> + Send + 'static {
    struct S {
        rx: UnboundedReceiver<Event>,
        meta: Meta,
        include_usage: bool,
        st: Arc<AppState>,
        offset: usize,
        ended: bool,
    }
    let s = S {
        rx,
        meta,
        include_usage,
        st,
        offset: 0,
        ended: false,
    };
    futures_util::stream::unfold(s, |mut s| async move {
        if s.ended {
            return None;
        }
        let chunk = |s: &S, text: &str, logprobs: Value, finish: Value| {
            json!({
                "id": s.meta.id,
                "object": "text_completion",
                "created": s.meta.created,
                "model": s.meta.model,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
            })
        };
        let out = match s.rx.recv().await {
            Some(Event::Text { text, logprobs }) => {
                let lp = if logprobs.is_empty() {
                    Value::Null
                } else {
                    completion_logprobs(&s.st, &logprobs, &mut s.offset)
                };
                sse_event(&chunk(&s, &text, lp, Value::Null))
            }
            Some(Event::Done(d)) => {
                s.ended = true;
                if d.finish == Finish::Cancelled {
                    sse_abort(cancelled_error())
                } else {
                    let last = chunk(&s, "", Value::Null, json!(finish_reason(d.finish, false)));
                    let usage_only = chunk(&s, "", Value::Null, Value::Null);
                    sse_finish(last, usage_only, &d, s.include_usage)
                }
            }
            Some(Event::Error(e)) => {
                s.ended = true;
                sse_early_end(Some(e))
            }
            None => {
                s.ended = true;
                sse_early_end(None)
            }
        };
        Some((out, s))
    })
}

// ---------------------------------------------------------------------------------------------
// Chat completions

/// Validates one message and converts it to a template value.
fn message_value(
    i: usize,
    v: &Value,
    vision: bool,
    images: &mut Vec<Vec<u8>>,
) -> Result<JValue, ApiError> {
    let p = format!("messages[{i}]");
    let Value::Object(m) = v else {
        return Err(ApiError::param(format!("'{p}' must be an object"), &p));
    };
    let prefix = format!("{p}.");
    let f = Fields { m, prefix: &prefix };
    let role = f
        .str("role")?
        .ok_or_else(|| ApiError::param(format!("'{p}.role' is required"), &format!("{p}.role")))?;
    let role = match role {
        "developer" => "system",
        r @ ("system" | "user" | "assistant" | "tool") => r,
        other => {
            return Err(ApiError::param(
                format!(
                    "'{p}.role' must be system, developer, user, assistant or tool, not '{other}'"
                ),
                &format!("{p}.role"),
            ))
        }
    };
    f.str("name")?;
    // As OpenAI: only an assistant message that calls tools may leave out its content.
    let calls_tools = role == "assistant"
        && matches!(f.get("tool_calls"), Some(Value::Array(c)) if !c.is_empty());
    if f.get("content").is_none() && !calls_tools {
        let what = if role == "assistant" {
            "is required unless the message has tool_calls"
        } else {
            "is required"
        };
        return Err(ApiError::param(
            format!("'{p}.content' {what}"),
            &format!("{p}.content"),
        ));
    }
    let content = match f.get("content") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for (j, part) in parts.iter().enumerate() {
                let pp = format!("{p}.content[{j}]");
                if !part.is_object() {
                    return Err(ApiError::param(format!("'{pp}' must be an object"), &pp));
                }
                match (part.get("type").and_then(|t| t.as_str()), part.get("text")) {
                    (None, _) => {
                        return Err(ApiError::param(
                            format!("'{pp}.type' is required (a string: text or image_url)"),
                            &format!("{pp}.type"),
                        ))
                    }
                    (Some("text"), Some(Value::String(t))) => s.push_str(t),
                    (Some("text"), _) => {
                        return Err(ApiError::param(
                            format!("'{pp}.text' must be a string"),
                            &format!("{pp}.text"),
                        ))
                    }
                    (Some("image_url"), _) if role == "user" => {
                        if !vision {
                            return Err(ApiError::param(
                                format!(
                                    "'{pp}': this server takes no images (start it with --mmproj)"
                                ),
                                &pp,
                            ));
                        }
                        images.push(image_part(part, &pp)?);
                        s.push_str(MEDIA_MARKER);
                    }
                    (Some("image_url" | "image" | "input_audio" | "video"), _) => {
                        return Err(ApiError::param(
                            format!("'{pp}': only text and (in user messages) image_url content is supported"),
                            &pp,
                        ))
                    }
                    _ => {
                        return Err(ApiError::param(
                            format!(
                                "'{pp}' must be a text part {{\"type\": \"text\", \"text\": …}}"
                            ),
                            &pp,
                        ))
                    }
                }
            }
            s
        }
        Some(_) => return Err(f.wrong("content", "a string, an array of text parts or null")),
    };
    let mut out: BTreeMap<String, JValue> = BTreeMap::new();
    out.insert("role".into(), JValue::from(role));
    out.insert("content".into(), JValue::from(content));
    if role == "assistant" {
        if let Some(r) = f.str("reasoning_content")? {
            out.insert("reasoning_content".into(), JValue::from(r));
        }
        match f.get("tool_calls") {
            None => {}
            Some(Value::Array(calls)) => {
                let mut vals = Vec::new();
                for (j, c) in calls.iter().enumerate() {
                    let cp = format!("{p}.tool_calls[{j}]");
                    if !matches!(c.get("type"), None | Some(Value::String(_)))
                        || c.get("type").is_some_and(|t| t != "function")
                    {
                        return Err(ApiError::param(
                            format!("'{cp}.type' must be \"function\""),
                            &format!("{cp}.type"),
                        ));
                    }
                    let func = c
                        .get("function")
                        .and_then(|x| x.as_object())
                        .ok_or_else(|| {
                            ApiError::param(format!("'{cp}.function' must be an object"), &cp)
                        })?;
                    let name = func.get("name").and_then(|x| x.as_str()).ok_or_else(|| {
                        ApiError::param(format!("'{cp}.function.name' must be a string"), &cp)
                    })?;
                    // The template iterates over the arguments as a mapping; the API sends a JSON string.
                    let args = match func.get("arguments") {
                        None | Some(Value::Null) => Value::Object(Map::new()),
                        Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
                        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                            Ok(v @ Value::Object(_)) => v,
                            _ => {
                                return Err(ApiError::param(
                                    format!(
                                    "'{cp}.function.arguments' must be a JSON object (as a string)"
                                ),
                                    &cp,
                                ))
                            }
                        },
                        Some(v @ Value::Object(_)) => v.clone(),
                        Some(_) => {
                            return Err(ApiError::param(
                                format!("'{cp}.function.arguments' must be a JSON object string"),
                                &cp,
                            ))
                        }
                    };
                    vals.push(to_jinja(&json!({
                        "type": "function",
                        "function": {"name": name, "arguments": args},
                    })));
                }
                out.insert("tool_calls".into(), JValue::from(vals));
            }
            Some(_) => return Err(f.wrong("tool_calls", "an array")),
        }
    }
    if role == "tool" {
        let id = f.str("tool_call_id")?.ok_or_else(|| {
            ApiError::param(
                format!("'{p}.tool_call_id' is required in a tool message"),
                &format!("{p}.tool_call_id"),
            )
        })?;
        out.insert("tool_call_id".into(), JValue::from(id));
    }
    Ok(JValue::from(out))
}

fn chat_logprobs(st: &AppState, lps: &[TokenLogprob]) -> Vec<Value> {
    let tok = st.engine.tok;
    let entry = |id: u32, lp: f32| {
        let bytes = tok.token_to_piece(id, true);
        json!({
            "token": String::from_utf8_lossy(&bytes),
            "logprob": lp,
            "bytes": bytes,
        })
    };
    lps.iter()
        .map(|lp| {
            let mut e = entry(lp.id, lp.logprob);
            e["top_logprobs"] = Value::Array(lp.top.iter().map(|&(i, l)| entry(i, l)).collect());
            e
        })
        .collect()
}

pub async fn chat_completions(
    State(st): St,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_auth(&st, &headers)?;
    let st2 = st.clone();
    // Rendering and tokenizing a large request takes a while: not on the async workers.
    let (mut p, started_in_think, use_tools) = blocking(move || prepare_chat(&st2, body)).await?;
    let rx = submit(&st, &mut p)?;
    let meta = Meta {
        id: new_id("chatcmpl"),
        model: st.model_id.clone(),
        created: now_secs(),
    };
    let split = ChatStream::new(started_in_think, use_tools);
    if p.settings.stream {
        Ok(sse(chat_stream(
            rx,
            meta,
            split,
            p.settings.include_usage,
            st,
        )))
    } else {
        chat_whole(rx, meta, split, st).await
    }
}

/// Runs request preparation on tokio's blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal error while preparing the request",
        )
    })?
}

/// Validates a chat request and builds its prompt; returns it with whether the prompt ends inside a
/// think block and whether tool calls are looked for.
fn prepare_chat(
    st: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Prepared, bool, bool), ApiError> {
    let m = parse_body(body)?;
    let f = Fields::new(&m);
    check_model(st, &f)?;
    check_openai_fields(&f, true, st.engine.tok.n_vocab())?;
    chat_template(st)?;
    let mut image_bytes: Vec<Vec<u8>> = Vec::new();
    let messages = match f.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .enumerate()
            .map(|(i, v)| message_value(i, v, st.images.is_some(), &mut image_bytes))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::Array(_)) => {
            return Err(ApiError::param("'messages' must not be empty", "messages"))
        }
        None => return Err(ApiError::param("'messages' is required", "messages")),
        Some(_) => return Err(f.wrong("messages", "an array of messages")),
    };
    let mut extra: Vec<(String, JValue)> = Vec::new();
    let mut thinking = st.default_thinking;
    if let Some(kw) = f.object("chat_template_kwargs")? {
        for (k, v) in kw {
            if k == "enable_thinking" {
                match v {
                    Value::Bool(b) => thinking = *b,
                    _ => {
                        return Err(ApiError::param(
                            "'chat_template_kwargs.enable_thinking' must be a boolean",
                            "chat_template_kwargs.enable_thinking",
                        ))
                    }
                }
            } else if k != "messages" && k != "add_generation_prompt" {
                extra.push((k.clone(), to_jinja(v)));
            }
        }
    }
    if let Some(b) = f.bool("enable_thinking")? {
        thinking = b;
    }
    let tools = match f.get("tools") {
        None => None,
        Some(Value::Array(a)) => {
            for (i, t) in a.iter().enumerate() {
                let ok = t
                    .get("function")
                    .and_then(|x| x.get("name"))
                    .is_some_and(|n| n.is_string());
                if !ok {
                    return Err(ApiError::param(
                        format!("'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"),
                        &format!("tools[{i}]"),
                    ));
                }
            }
            if a.is_empty() {
                None
            } else {
                Some(a)
            }
        }
        Some(_) => return Err(f.wrong("tools", "an array of tools")),
    };
    let tool_choice_none = matches!(f.get("tool_choice"), Some(Value::String(s)) if s == "none");
    let use_tools = tools.is_some() && !tool_choice_none;
    if let Some(t) = tools.filter(|_| use_tools) {
        extra.push(("tools".into(), to_jinja(&Value::Array(t.clone()))));
    }
    let mut settings = gen_settings(&f, SamplingParams::qwen35(thinking), &st.engine)?;
    if let Some(t) = tools.filter(|_| use_tools) {
        settings.constraint = strict_tools(&f, t, settings.constraint.take(), &st.engine)?;
    }
    let logprobs = if f.bool("logprobs")?.unwrap_or(false) {
        Some(f.uint("top_logprobs", 20)?.unwrap_or(0) as usize)
    } else {
        None
    };

    let ChatPrompt {
        prompt,
        checkpoints,
        started_in_think,
    } = render_chat(st, messages, &image_bytes, thinking, extra)?;
    let p = Prepared {
        prompt,
        checkpoints,
        settings,
        logprobs,
        special: true,
        cache_output: false,
    };
    Ok((p, started_in_think, use_tools))
}

/// The server's chat template, or the error for a model without one.
pub(super) fn chat_template(st: &AppState) -> Result<&ChatTemplate, ApiError> {
    st.template.as_ref().ok_or_else(|| {
        ApiError::invalid("this model has no usable chat template; use /v1/completions")
    })
}

/// A conversation rendered and tokenized for generation.
pub(super) struct ChatPrompt {
    pub(super) prompt: Prompt,
    /// Where the history ends: snapshotted for the conversation's next turn.
    pub(super) checkpoints: Vec<usize>,
    /// The generation prompt ends inside `<think>` (thinking on).
    pub(super) started_in_think: bool,
}

/// Renders validated messages (template values; each image is a [`MEDIA_MARKER`] in a content, its
/// bytes in `image_bytes` in order) with the generation prompt, encodes the images and tokenizes.
pub(super) fn render_chat(
    st: &AppState,
    messages: Vec<JValue>,
    image_bytes: &[Vec<u8>],
    thinking: bool,
    extra: Vec<(String, JValue)>,
) -> Result<ChatPrompt, ApiError> {
    let template = chat_template(st)?;
    let hist_opts = ChatOptions {
        add_generation_prompt: false,
        enable_thinking: Some(thinking),
        extra,
    };
    let full_opts = ChatOptions {
        add_generation_prompt: true,
        ..hist_opts.clone()
    };
    let template_err = |e: crate::chat::ChatError| {
        ApiError::param(format!("cannot render the conversation: {e}"), "messages")
    };
    let full = template
        .render_values(messages.clone(), &full_opts)
        .map_err(template_err)?;
    let tok = st.engine.tok;
    // The images, encoded once for the whole prompt and its history's snapshot.
    let images = match st.images {
        Some(enc) if !image_bytes.is_empty() => {
            let mut scratch = VisionScratch::new();
            let mut out = Vec::with_capacity(image_bytes.len());
            for (k, b) in image_bytes.iter().enumerate() {
                let e = enc.encode_bytes(b, &mut scratch).map_err(|e| {
                    ApiError::param(format!("image {k}: {e:#}"), "messages").code("invalid_image")
                })?;
                out.push(e.image);
            }
            out
        }
        _ => Vec::new(),
    };
    let encode = |s: &str| -> Result<Prompt, ApiError> {
        let n = s.matches(MEDIA_MARKER).count();
        prompt_with_media(tok, s, images[..n.min(images.len())].to_vec())
            .map_err(|e| ApiError::invalid(format!("cannot tokenize: {e:#}")))
    };
    let prompt = encode(&full)?;
    check_context(prompt.len(), st.engine.n_ctx)?;
    // The end of the history (before the generation prompt) is where the next turn of this
    // conversation will resume: snapshot it there.
    let mut checkpoints = Vec::new();
    if let Ok(hist) = template.render_values(messages, &hist_opts) {
        if full.starts_with(&hist) && !hist.is_empty() {
            let h = encode(&hist)?.cache_key();
            if prompt.cache_key().starts_with(&h) {
                checkpoints.push(h.len());
            }
        }
    }
    Ok(ChatPrompt {
        prompt,
        checkpoints,
        // With thinking on, the generation prompt ends inside `<think>`.
        started_in_think: full.trim_end().ends_with(crate::chat::THINK_OPEN),
    })
}

async fn chat_whole(
    mut rx: UnboundedReceiver<Event>,
    meta: Meta,
    mut split: ChatStream,
    st: Arc<AppState>,
) -> Result<Response, ApiError> {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut take = |ds: Vec<Delta>| {
        for d in ds {
            match d {
                Delta::Content(t) => content.push_str(&t),
                Delta::Reasoning(t) => reasoning.push_str(&t),
            }
        }
    };
    let (done, lps) = collect(&mut rx, |text| take(split.push(&text))).await?;
    let (rest, calls) = split.finish();
    take(rest);
    let mut message = json!({"role": "assistant", "content": content});
    let reasoning = reasoning.trim_end_matches('\n');
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        let list: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = tool_call_json(c, i, &new_id("call"));
                if let Some(o) = v.as_object_mut() {
                    o.remove("index");
                }
                v
            })
            .collect();
        message["tool_calls"] = Value::Array(list);
        if content.trim().is_empty() {
            message["content"] = Value::Null;
        }
    }
    let logprobs = if lps.is_empty() {
        Value::Null
    } else {
        json!({"content": chat_logprobs(&st, &lps)})
    };
    Ok(json_body(&json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason(done.finish, !calls.is_empty()),
        }],
        "usage": usage_json(&done),
        "timings": timings_json(&done),
    })))
}

fn chat_stream(
    rx: UnboundedReceiver<Event>,
    meta: Meta,
    split: ChatStream,
    include_usage: bool,
    st: Arc<AppState>,
) -> impl futures_util::Stream<Item = String> + Send + 'static {
    struct S {
        rx: UnboundedReceiver<Event>,
        meta: Meta,
        split: ChatStream,
        include_usage: bool,
        st: Arc<AppState>,
        started: bool,
        ended: bool,
    }
    let s = S {
        rx,
        meta,
        split,
        include_usage,
        st,
        started: false,
        ended: false,
    };
    fn chunk(s: &S, delta: Value, logprobs: Value, finish: Value) -> Value {
        json!({
            "id": s.meta.id,
            "object": "chat.completion.chunk",
            "created": s.meta.created,
            "model": s.meta.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        })
    }
    fn deltas(s: &S, ds: Vec<Delta>, lps: &[TokenLogprob]) -> String {
        let mut out = String::new();
        let mut lp = if lps.is_empty() {
            Value::Null
        } else {
            json!({"content": chat_logprobs(&s.st, lps)})
        };
        for d in ds {
            let delta = match d {
                Delta::Content(t) => json!({"content": t}),
                Delta::Reasoning(t) => json!({"reasoning_content": t}),
            };
            out += &sse_event(&chunk(s, delta, std::mem::take(&mut lp), Value::Null));
        }
        if !lp.is_null() {
            // Tokens whose text is held back still report their log-probabilities.
            out += &sse_event(&chunk(s, json!({}), lp, Value::Null));
        }
        out
    }
    futures_util::stream::unfold(s, |mut s| async move {
        if s.ended {
            return None;
        }
        loop {
            let mut out = String::new();
            if !s.started {
                s.started = true;
                out += &sse_event(&chunk(
                    &s,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    Value::Null,
                ));
            }
            match s.rx.recv().await {
                Some(Event::Text { text, logprobs }) => {
                    let ds = s.split.push(&text);
                    out += &deltas(&s, ds, &logprobs);
                }
                Some(Event::Done(d)) => {
                    s.ended = true;
                    if d.finish == Finish::Cancelled {
                        out += &sse_abort(cancelled_error());
                        return Some((out, s));
                    }
                    let (rest, calls) = s.split.finish();
                    out += &deltas(&s, rest, &[]);
                    if !calls.is_empty() {
                        let list: Vec<Value> = calls
                            .iter()
                            .enumerate()
                            .map(|(i, c)| tool_call_json(c, i, &new_id("call")))
                            .collect();
                        out += &sse_event(&chunk(
                            &s,
                            json!({"tool_calls": list}),
                            Value::Null,
                            Value::Null,
                        ));
                    }
                    let last = chunk(
                        &s,
                        json!({}),
                        Value::Null,
                        json!(finish_reason(d.finish, !calls.is_empty())),
                    );
                    let usage_only = chunk(&s, json!({}), Value::Null, Value::Null);
                    out += &sse_finish(last, usage_only, &d, s.include_usage);
                    return Some((out, s));
                }
                Some(Event::Error(e)) => {
                    s.ended = true;
                    out += &sse_early_end(Some(e));
                    return Some((out, s));
                }
                None => {
                    s.ended = true;
                    out += &sse_early_end(None);
                    return Some((out, s));
                }
            }
            if !out.is_empty() {
                return Some((out, s));
            }
        }
    })
}

/// The bytes of an image part's `data:` URL (PNG, JPEG or WebP); remote URLs are refused.
fn image_part(part: &Value, pp: &str) -> Result<Vec<u8>, ApiError> {
    let param = format!("{pp}.image_url");
    // `{"image_url": {"url": "…", "detail": …}}`, or the url as a bare string.
    let url = match part.get("image_url") {
        Some(Value::String(u)) => u.clone(),
        Some(Value::Object(o)) => match o.get("url") {
            Some(Value::String(u)) => u.clone(),
            _ => {
                return Err(ApiError::param(
                    format!("'{param}.url' must be a string (data:image/png;base64,…)"),
                    &param,
                ))
            }
        },
        _ => {
            return Err(ApiError::param(
                format!("'{param}' must be {{\"url\": \"data:image/png;base64,…\"}}"),
                &param,
            ))
        }
    };
    let lower = url.get(..8).unwrap_or(&url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https:/") {
        return Err(ApiError::param(
            format!("'{param}': remote image URLs are not fetched; send the image as a data URL (data:image/png;base64,…)"),
            &param,
        )
        .code("remote_image_url"));
    }
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(ApiError::param(
            format!("'{param}': the url must be a data URL (data:image/png;base64,…)"),
            &param,
        ));
    };
    let Some((meta, data)) = rest.split_once(',') else {
        return Err(ApiError::param(
            format!("'{param}': a data URL without ','"),
            &param,
        ));
    };
    let mut meta = meta.split(';');
    let mime = meta.next().unwrap_or("").to_ascii_lowercase();
    if !matches!(
        mime.as_str(),
        "image/png" | "image/jpeg" | "image/jpg" | "image/webp"
    ) {
        return Err(ApiError::param(
            format!("'{param}': image type '{mime}' is not supported (image/png, image/jpeg, image/webp)"),
            &param,
        ));
    }
    if !meta.any(|m| m.eq_ignore_ascii_case("base64")) {
        return Err(ApiError::param(
            format!("'{param}': the data URL must be base64"),
            &param,
        ));
    }
    decode_base64(data).map_err(|e| {
        ApiError::param(format!("'{param}': bad base64 data: {e}"), &param).code("invalid_image")
    })
}

/// Standard base64 (padding optional, ASCII whitespace ignored).
pub(super) fn decode_base64(s: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits, mut pad) = (0u32, 0u32, 0usize);
    for (i, c) in s.bytes().enumerate() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => {
                pad += 1;
                continue;
            }
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return Err(format!("invalid character at {i}")),
        };
        if pad > 0 {
            return Err(format!("data after the padding at {i}"));
        }
        acc = acc << 6 | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if bits >= 6 || pad > 2 {
        return Err("truncated".into());
    }
    if out.is_empty() {
        return Err("no data".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"secret", b"secret2"));
        assert!(!ct_eq(b"", b"x"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn base64_decodes_standard_and_refuses_garbage() {
        assert_eq!(decode_base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(decode_base64("aGVsbG8").unwrap(), b"hello");
        assert_eq!(decode_base64("aGVs\nbG8h").unwrap(), b"hello!");
        assert!(decode_base64("aGVsbG8=x").is_err());
        assert!(decode_base64("a").is_err());
        assert!(decode_base64("@@@@").is_err());
        assert!(decode_base64("").is_err());
    }
}
