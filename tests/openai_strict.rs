//! The OpenAI endpoints check requests as OpenAI does: malformed ones are 4xx in the OpenAI error
//! shape with `param` naming the field at fault; vendor extensions are let through.

mod common;

use common::{Server, MODEL_ID};
use serde_json::{json, Value};

fn chat_with(extra: Value) -> Value {
    let mut b = json!({
        "model": MODEL_ID,
        "messages": [{"role": "system", "content": "You are a scribe."}, {"role": "user", "content": "x"}],
        "max_tokens": 2,
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn messages(m: Value) -> Value {
    chat_with(json!({ "messages": m }))
}

const TOOL: &str =
    r#"{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}"#;

#[test]
fn malformed_openai_requests() {
    let s = Server::start(&["-c", "1024"]);
    let tool: Value = serde_json::from_str(TOOL).unwrap();
    let user = |c: Value| json!({"role": "user", "content": c});
    let call =
        json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}});
    let c = "/v1/chat/completions";
    let t = "/v1/completions";
    let p = |extra: Value| {
        let mut b = json!({"model": MODEL_ID, "prompt": "In the beginning", "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let ch = |extra: Value| chat_with(extra).to_string();
    let ms = |m: Value| messages(m).to_string();
    // (path, body, status, param)
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        // The body.
        (c, "{not json".into(), 400, None),
        (c, "".into(), 400, None),
        (c, "[1, 2]".into(), 400, None),
        (c, "null".into(), 400, None),
        (c, "\"hi\"".into(), 400, None),
        (c, "{} {}".into(), 400, None),
        // messages.
        (
            c,
            json!({"model": MODEL_ID}).to_string(),
            400,
            Some("messages"),
        ),
        (c, ch(json!({"messages": "hi"})), 400, Some("messages")),
        (
            c,
            ch(json!({"messages": {"role": "user"}})),
            400,
            Some("messages"),
        ),
        (c, ch(json!({"messages": []})), 400, Some("messages")),
        (c, ms(json!([5])), 400, Some("messages[0]")),
        (c, ms(json!(["hi"])), 400, Some("messages[0]")),
        (
            c,
            ms(json!([{"content": "x"}])),
            400,
            Some("messages[0].role"),
        ),
        (
            c,
            ms(json!([{"role": "wizard", "content": "x"}])),
            400,
            Some("messages[0].role"),
        ),
        (
            c,
            ms(json!([{"role": "function", "content": "x"}])),
            400,
            Some("messages[0].role"),
        ),
        (
            c,
            ms(json!([{"role": 3, "content": "x"}])),
            400,
            Some("messages[0].role"),
        ),
        (
            c,
            ms(json!([{"role": "user"}])),
            400,
            Some("messages[0].content"),
        ),
        (
            c,
            ms(json!([{"role": "user", "content": null}])),
            400,
            Some("messages[0].content"),
        ),
        (
            c,
            ms(json!([{"role": "system"}, user(json!("x"))])),
            400,
            Some("messages[0].content"),
        ),
        (
            c,
            ms(json!([{"role": "developer"}, user(json!("x"))])),
            400,
            Some("messages[0].content"),
        ),
        (
            c,
            ms(json!([user(json!("x")), {"role": "assistant"}])),
            400,
            Some("messages[1].content"),
        ),
        (
            c,
            ms(json!([user(json!("x")), {"role": "assistant", "tool_calls": []}])),
            400,
            Some("messages[1].content"),
        ),
        (
            c,
            ms(json!([user(json!(5))])),
            400,
            Some("messages[0].content"),
        ),
        (
            c,
            ms(json!([user(json!(true))])),
            400,
            Some("messages[0].content"),
        ),
        (
            c,
            ms(json!([user(json!({"text": "x"}))])),
            400,
            Some("messages[0].content"),
        ),
        (
            c,
            ms(json!([user(json!([5]))])),
            400,
            Some("messages[0].content[0]"),
        ),
        (
            c,
            ms(json!([user(json!(["x"]))])),
            400,
            Some("messages[0].content[0]"),
        ),
        (
            c,
            ms(json!([user(json!([{"text": "x"}]))])),
            400,
            Some("messages[0].content[0].type"),
        ),
        (
            c,
            ms(json!([user(json!([{"type": "text"}]))])),
            400,
            Some("messages[0].content[0].text"),
        ),
        (
            c,
            ms(json!([user(json!([{"type": "text", "text": 5}]))])),
            400,
            Some("messages[0].content[0].text"),
        ),
        (
            c,
            ms(json!([user(json!([{"type": "banana", "text": "x"}]))])),
            400,
            Some("messages[0].content[0]"),
        ),
        (
            c,
            ms(json!([user(
                json!([{"type": "input_audio", "input_audio": {}}])
            )])),
            400,
            Some("messages[0].content[0]"),
        ),
        (
            c,
            ms(json!([user(
                json!([{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}])
            )])),
            400,
            Some("messages[0].content[0]"),
        ),
        (
            c,
            ms(
                json!([{"role": "system", "content": [{"type": "image_url", "image_url": "x"}]}, user(json!("x"))]),
            ),
            400,
            Some("messages[0].content[0]"),
        ),
        (
            c,
            ms(json!([{"role": "user", "content": "x", "name": 5}])),
            400,
            Some("messages[0].name"),
        ),
        (
            c,
            ms(json!([user(json!("x")), {"role": "tool", "content": "sunny"}])),
            400,
            Some("messages[1].tool_call_id"),
        ),
        (
            c,
            ms(json!([user(json!("x")), {"role": "tool", "content": "sunny", "tool_call_id": 5}])),
            400,
            Some("messages[1].tool_call_id"),
        ),
        (
            c,
            ms(json!([user(json!("x")), {"role": "tool", "tool_call_id": "c1"}])),
            400,
            Some("messages[1].content"),
        ),
        (
            c,
            ms(
                json!([user(json!("x")), {"role": "assistant", "content": null, "tool_calls": "f"}]),
            ),
            400,
            Some("messages[1].content"),
        ),
        (
            c,
            ms(json!([user(json!("x")), {"role": "assistant", "content": "", "tool_calls": "f"}])),
            400,
            Some("messages[1].tool_calls"),
        ),
        (
            c,
            ms(json!([user(json!("x")), {"role": "assistant", "tool_calls": [5]}])),
            400,
            Some("messages[1].tool_calls[0]"),
        ),
        (
            c,
            ms(
                json!([user(json!("x")), {"role": "assistant", "tool_calls": [{"type": "function"}]}]),
            ),
            400,
            Some("messages[1].tool_calls[0]"),
        ),
        (
            c,
            ms(
                json!([user(json!("x")), {"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}]),
            ),
            400,
            Some("messages[1].tool_calls[0].type"),
        ),
        (
            c,
            ms(
                json!([user(json!("x")), {"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]),
            ),
            400,
            Some("messages[1].tool_calls[0]"),
        ),
        (
            c,
            ms(
                json!([user(json!("x")), {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]),
            ),
            400,
            Some("messages[1].tool_calls[0]"),
        ),
        (
            c,
            ms(
                json!([user(json!("x")), {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]),
            ),
            400,
            Some("messages[1].tool_calls[0]"),
        ),
        (
            c,
            ms(
                json!([user(json!("x")), {"role": "assistant", "content": "x", "reasoning_content": 5}]),
            ),
            400,
            Some("messages[1].reasoning_content"),
        ),
        // The model.
        (c, ch(json!({"model": "gpt-4o"})), 404, Some("model")),
        (c, ch(json!({"model": 5})), 400, Some("model")),
        // Sampling values: types and ranges.
        (
            c,
            ch(json!({"temperature": "hot"})),
            400,
            Some("temperature"),
        ),
        (
            c,
            ch(json!({"temperature": -0.1})),
            400,
            Some("temperature"),
        ),
        (c, ch(json!({"temperature": 2.5})), 400, Some("temperature")),
        (c, ch(json!({"top_p": 1.1})), 400, Some("top_p")),
        (c, ch(json!({"top_p": -1})), 400, Some("top_p")),
        (c, ch(json!({"top_p": "all"})), 400, Some("top_p")),
        (c, ch(json!({"top_k": -1})), 400, Some("top_k")),
        (c, ch(json!({"top_k": 1.5})), 400, Some("top_k")),
        (c, ch(json!({"min_p": 2})), 400, Some("min_p")),
        (
            c,
            ch(json!({"presence_penalty": 2.5})),
            400,
            Some("presence_penalty"),
        ),
        (
            c,
            ch(json!({"presence_penalty": -3})),
            400,
            Some("presence_penalty"),
        ),
        (
            c,
            ch(json!({"frequency_penalty": 9})),
            400,
            Some("frequency_penalty"),
        ),
        (
            c,
            ch(json!({"frequency_penalty": "x"})),
            400,
            Some("frequency_penalty"),
        ),
        (
            c,
            ch(json!({"repeat_penalty": -1})),
            400,
            Some("repeat_penalty"),
        ),
        (c, ch(json!({"seed": "lucky"})), 400, Some("seed")),
        (c, ch(json!({"seed": 1.5})), 400, Some("seed")),
        (c, ch(json!({"max_tokens": 0})), 400, Some("max_tokens")),
        (c, ch(json!({"max_tokens": -1})), 400, Some("max_tokens")),
        (c, ch(json!({"max_tokens": "ten"})), 400, Some("max_tokens")),
        (c, ch(json!({"max_tokens": 2.5})), 400, Some("max_tokens")),
        (
            c,
            ch(json!({"max_completion_tokens": 0})),
            400,
            Some("max_completion_tokens"),
        ),
        (
            c,
            ch(json!({"max_completion_tokens": -4})),
            400,
            Some("max_completion_tokens"),
        ),
        (c, ch(json!({"n": 2})), 400, Some("n")),
        (c, ch(json!({"n": 0})), 400, Some("n")),
        (c, ch(json!({"n": "one"})), 400, Some("n")),
        (c, ch(json!({"stop": 7})), 400, Some("stop")),
        (c, ch(json!({"stop": [1]})), 400, Some("stop")),
        (
            c,
            ch(json!({"stop": ["a", "b", "c", "d", "e"]})),
            400,
            Some("stop"),
        ),
        (c, ch(json!({"stop": {"a": 1}})), 400, Some("stop")),
        (c, ch(json!({"stop": "x".repeat(600)})), 400, Some("stop")),
        (
            c,
            ch(json!({"logit_bias": [1, 2]})),
            400,
            Some("logit_bias"),
        ),
        (
            c,
            ch(json!({"logit_bias": "none"})),
            400,
            Some("logit_bias"),
        ),
        (
            c,
            ch(json!({"logit_bias": {"hello": 1}})),
            400,
            Some("logit_bias.hello"),
        ),
        (
            c,
            ch(json!({"logit_bias": {"99999999": 1}})),
            400,
            Some("logit_bias.99999999"),
        ),
        (
            c,
            ch(json!({"logit_bias": {"5": 101}})),
            400,
            Some("logit_bias.5"),
        ),
        (
            c,
            ch(json!({"logit_bias": {"5": "up"}})),
            400,
            Some("logit_bias.5"),
        ),
        (
            c,
            ch(json!({"logit_bias": {"5": 3}})),
            400,
            Some("logit_bias"),
        ),
        // Streaming and log-probabilities.
        (c, ch(json!({"stream": "yes"})), 400, Some("stream")),
        (c, ch(json!({"stream": 1})), 400, Some("stream")),
        (
            c,
            ch(json!({"stream_options": {"include_usage": true}})),
            400,
            Some("stream_options"),
        ),
        (
            c,
            ch(json!({"stream": true, "stream_options": "usage"})),
            400,
            Some("stream_options"),
        ),
        (
            c,
            ch(json!({"stream": true, "stream_options": {"include_usage": "yes"}})),
            400,
            Some("stream_options.include_usage"),
        ),
        (c, ch(json!({"logprobs": "yes"})), 400, Some("logprobs")),
        (c, ch(json!({"top_logprobs": 3})), 400, Some("top_logprobs")),
        (
            c,
            ch(json!({"logprobs": true, "top_logprobs": 21})),
            400,
            Some("top_logprobs"),
        ),
        (
            c,
            ch(json!({"logprobs": true, "top_logprobs": -1})),
            400,
            Some("top_logprobs"),
        ),
        (c, ch(json!({"user": 5})), 400, Some("user")),
        // Tools.
        (c, ch(json!({"tools": "f"})), 400, Some("tools")),
        (c, ch(json!({"tools": [5]})), 400, Some("tools[0].type")),
        (
            c,
            ch(json!({"tools": [{"function": {"name": "f"}}]})),
            400,
            Some("tools[0].type"),
        ),
        (
            c,
            ch(json!({"tools": [{"type": "retrieval", "function": {"name": "f"}}]})),
            400,
            Some("tools[0].type"),
        ),
        (
            c,
            ch(json!({"tools": [{"type": "function"}]})),
            400,
            Some("tools[0]"),
        ),
        (
            c,
            ch(json!({"tools": [{"type": "function", "function": {"name": 5}}]})),
            400,
            Some("tools[0]"),
        ),
        (
            c,
            ch(
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "none"}}]}),
            ),
            400,
            Some("tools[0].function.parameters"),
        ),
        (
            c,
            ch(json!({"tools": [tool.clone()], "tool_choice": "sometimes"})),
            400,
            Some("tool_choice"),
        ),
        (
            c,
            ch(json!({"tools": [tool.clone()], "tool_choice": 1})),
            400,
            Some("tool_choice"),
        ),
        (
            c,
            ch(
                json!({"tools": [tool.clone()], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            ),
            400,
            Some("tool_choice"),
        ),
        (
            c,
            ch(json!({"tools": [tool.clone()], "tool_choice": {"type": "function"}})),
            400,
            Some("tool_choice"),
        ),
        (
            c,
            ch(json!({"chat_template_kwargs": "x"})),
            400,
            Some("chat_template_kwargs"),
        ),
        (
            c,
            ch(json!({"chat_template_kwargs": {"enable_thinking": "no"}})),
            400,
            Some("chat_template_kwargs.enable_thinking"),
        ),
        (
            c,
            ch(json!({"enable_thinking": "no"})),
            400,
            Some("enable_thinking"),
        ),
        (c, ch(json!({"ignore_eos": "no"})), 400, Some("ignore_eos")),
        // The prompt is longer than the context.
        (
            c,
            ms(json!([user(json!("and it came to pass ".repeat(400)))])),
            400,
            None,
        ),
        // Text completions.
        (
            t,
            json!({"model": MODEL_ID}).to_string(),
            400,
            Some("prompt"),
        ),
        (t, p(json!({"prompt": 5})), 400, Some("prompt")),
        (t, p(json!({"prompt": [1, 99999999]})), 400, Some("prompt")),
        (t, p(json!({"prompt": ["a", "b"]})), 400, Some("prompt")),
        (t, p(json!({"prompt": ""})), 400, Some("prompt")),
        (t, p(json!({"max_tokens": 0})), 400, Some("max_tokens")),
        (t, p(json!({"temperature": 3})), 400, Some("temperature")),
        (t, p(json!({"logprobs": 21})), 400, Some("logprobs")),
        (t, p(json!({"echo": true})), 400, Some("echo")),
        (t, p(json!({"suffix": "end"})), 400, Some("suffix")),
        (
            t,
            p(json!({"stop": ["a", "b", "c", "d", "e"]})),
            400,
            Some("stop"),
        ),
        (
            t,
            p(json!({"logit_bias": {"x": 1}})),
            400,
            Some("logit_bias.x"),
        ),
        (
            t,
            p(json!({"stream_options": {"include_usage": true}})),
            400,
            Some("stream_options"),
        ),
        (t, p(json!({"n": 3})), 400, Some("n")),
        (t, p(json!({"model": "davinci"})), 404, Some("model")),
        // Elsewhere.
        (
            "/tokenize",
            json!({"content": null}).to_string(),
            400,
            Some("content"),
        ),
        (
            "/tokenize",
            json!({"content": "x", "add_special": "yes"}).to_string(),
            400,
            Some("add_special"),
        ),
        (
            "/detokenize",
            json!({"tokens": [-1]}).to_string(),
            400,
            Some("tokens"),
        ),
        (
            "/detokenize",
            json!({"tokens": "1 2"}).to_string(),
            400,
            Some("tokens"),
        ),
        ("/v1/nothing", "{}".into(), 404, None),
    ];
    assert!(cases.len() >= 100, "{} cases", cases.len());
    for (path, body, want, param) in &cases {
        let r = s.post_text(path, body);
        assert_eq!(r.status, *want, "{path} {body}: {}", r.text);
        let v = r.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("code").is_some(), "{v}");
        if let Some(p) = param {
            assert_eq!(e["param"], *p, "{path} {body}: {v}");
        }
    }

    // Valid requests the checks must let through: a tool conversation, content parts, an assistant
    // with tool calls and no content, vendor and structured-output fields this server may not use.
    let ok: Vec<Value> = vec![
        messages(json!([
            user(json!("weather?")),
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ])),
        messages(json!([user(
            json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
        )])),
        messages(json!([{"role": "developer", "content": "Be brief."}, user(json!("x"))])),
        chat_with(
            json!({"tools": [tool.clone()], "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": false}),
        ),
        chat_with(json!({"tools": [tool.clone()], "tool_choice": "required"})),
        chat_with(json!({"stop": ["a", "b", "c", "d"], "logit_bias": {}, "user": "u1", "n": 1})),
        chat_with(
            json!({"stream": false, "stream_options": null, "logprobs": true, "top_logprobs": 2}),
        ),
        chat_with(
            json!({"cache_prompt": true, "n_predict": 4, "top_k": 5, "min_p": 0.1, "typical_p": 1.0, "mirostat": 0}),
        ),
        chat_with(json!({"response_format": {"type": "text"}})),
        chat_with(json!({"max_completion_tokens": 1, "metadata": {"a": "b"}, "store": false})),
    ];
    for body in &ok {
        let r = s.post(c, body);
        assert_eq!(r.status, 200, "{body}: {}", r.text);
    }
    let r = s.post(
        t,
        &json!({"prompt": "And God said", "max_tokens": 1, "n": 1, "cache_prompt": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(s.health()["requests"]["failed"], 0);
}
