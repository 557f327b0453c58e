//! Ollama's API on `deltaq serve` (the demo model, whose answers are Bible-like text: the checks are
//! on the shape of the answers, not their content).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Reply, Server, MODEL_ID};
use serde_json::{json, Value};

fn listed() -> String {
    format!("{MODEL_ID}:latest")
}

fn msgs(content: &str) -> Value {
    json!([{"role": "system", "content": "You are a scribe."}, {"role": "user", "content": content}])
}

fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() >= 20 && b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && s.ends_with('Z')
}

/// An Ollama error: a 4xx and `{"error": "<non-empty string>"}` and nothing else.
fn assert_ollama_error(r: &Reply, what: &str) {
    assert!(
        (400..500).contains(&r.status),
        "{what}: {} {}",
        r.status,
        r.text
    );
    let v = r.json();
    let o = v.as_object().unwrap_or_else(|| panic!("{what}: {v}"));
    assert_eq!(o.len(), 1, "{what}: {v}");
    assert!(
        o["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{what}: {v}"
    );
}

/// The final object of an answer: done, a reason and the counters.
fn assert_final(v: &Value, max_eval: u64) {
    assert_eq!(v["done"], true, "{v}");
    let reason = v["done_reason"].as_str().unwrap();
    assert!(reason == "stop" || reason == "length", "{v}");
    let eval = v["eval_count"].as_u64().unwrap();
    assert!(eval >= 1 && eval <= max_eval, "{v}");
    if reason == "length" {
        assert_eq!(eval, max_eval, "{v}");
    }
    assert!(v["prompt_eval_count"].as_u64().unwrap() >= 1, "{v}");
    for k in ["prompt_eval_duration", "eval_duration"] {
        assert!(v[k].as_u64().unwrap() > 0, "{k}: {v}");
    }
    assert!(v["total_duration"].as_u64().unwrap() >= v["eval_duration"].as_u64().unwrap());
    assert!(v["load_duration"].is_u64(), "{v}");
    assert!(is_rfc3339(v["created_at"].as_str().unwrap()), "{v}");
}

/// A streamed answer: NDJSON, every object but the last not done, the last with the counters.
fn stream_lines(r: &Reply, max_eval: u64) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.content_type, "application/x-ndjson");
    let lines = r.lines();
    assert!(lines.len() >= 2, "{}", r.text);
    let (last, rest) = lines.split_last().unwrap();
    for l in rest {
        assert_eq!(l["done"], false, "{l}");
        assert!(is_rfc3339(l["created_at"].as_str().unwrap()), "{l}");
    }
    assert_final(last, max_eval);
    lines
}

#[test]
fn model_information() {
    let s = Server::start(&["-c", "1024"]);
    let v = s.get("/api/version");
    assert_eq!(v.status, 200);
    assert!(v.json()["version"].as_str().unwrap().contains('.'));

    let t = s.get("/api/tags").json();
    let models = t["models"].as_array().unwrap();
    assert_eq!(models.len(), 1);
    let m = &models[0];
    assert_eq!(m["name"], listed());
    assert_eq!(m["model"], listed());
    assert!(m["size"].as_u64().unwrap() > 1000);
    assert!(is_rfc3339(m["modified_at"].as_str().unwrap()), "{m}");
    let d = &m["details"];
    assert_eq!(d["format"], "gguf");
    assert_eq!(d["family"], "qwen35");
    assert_eq!(d["quantization_level"], "Q8_0");
    assert!(d["parameter_size"].as_str().unwrap().ends_with('M'), "{d}");

    let p = s.get("/api/ps").json();
    assert_eq!(p["models"][0]["name"], listed());
    assert_eq!(p["models"][0]["context_length"], 1024);
    assert!(is_rfc3339(p["models"][0]["expires_at"].as_str().unwrap()));

    // The listed name and the bare id both work; `name` is the older field.
    for body in [
        json!({"model": listed()}),
        json!({"model": MODEL_ID}),
        json!({"name": MODEL_ID}),
    ] {
        let r = s.post("/api/show", &body);
        assert_eq!(r.status, 200, "{body}: {}", r.text);
        let v = r.json();
        assert_eq!(v["details"]["family"], "qwen35");
        assert_eq!(v["model_info"]["general.architecture"], "qwen35");
        assert!(v["model_info"]["general.parameter_count"].as_u64().unwrap() > 0);
        assert!(v["template"].as_str().unwrap().contains("<|im_start|>"));
        let caps: Vec<&str> = v["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert!(
            caps.contains(&"completion") && caps.contains(&"tools"),
            "{caps:?}"
        );
        assert!(caps.contains(&"thinking"), "{caps:?}");
        assert!(!caps.contains(&"vision"), "no --mmproj: {caps:?}");
    }
    let r = s.post("/api/show", &json!({"model": "llama3"}));
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json()["error"],
        "model \"llama3\" not found, try pulling it first"
    );
}

#[test]
fn chat_and_generate() {
    let s = Server::start(&["-c", "1024"]);

    // Chat, whole, thinking off.
    let r = s.post(
        "/api/chat",
        &json!({"model": MODEL_ID, "messages": msgs("Who was Moses?"), "stream": false,
                "think": false, "options": {"num_predict": 12, "seed": 7}}),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.content_type.starts_with("application/json"));
    let v = r.json();
    assert_eq!(v["model"], MODEL_ID);
    assert_eq!(v["message"]["role"], "assistant");
    let content = v["message"]["content"].as_str().unwrap();
    assert!(!content.contains("<think>") && !content.contains("</think>"));
    assert!(v["message"].get("thinking").is_none(), "{v}");
    assert_final(&v, 12);

    // Chat, whole, thinking on: the thoughts come apart from the content.
    let r = s.post(
        "/api/chat",
        &json!({"model": listed(), "messages": msgs("Who was Moses?"), "stream": false,
                "think": true, "options": {"num_predict": 16, "ignore_eos": true}}),
    );
    let v = r.json();
    assert_eq!(r.status, 200, "{v}");
    let thinking = v["message"]["thinking"].as_str().unwrap_or("");
    assert!(!thinking.is_empty(), "{v}");
    assert!(!thinking.contains("<think>"), "{v}");
    assert_final(&v, 16);

    // Chat streamed (the default): NDJSON pieces, the last one done.
    let r = s.post(
        "/api/chat",
        &json!({"model": MODEL_ID, "messages": msgs("Who was Aaron?"), "think": true,
                "options": {"num_predict": 10, "temperature": 0, "ignore_eos": true}}),
    );
    let lines = stream_lines(&r, 10);
    let text: String = lines
        .iter()
        .map(|l| {
            l["message"]["content"].as_str().unwrap().to_string()
                + l["message"]["thinking"].as_str().unwrap_or("")
        })
        .collect();
    assert!(!text.is_empty());
    assert!(lines.iter().all(|l| l["message"]["role"] == "assistant"));

    // Generate: greedy, whole and streamed give the same text.
    // (ignore_eos, the llama.cpp extension: greedy, this model may end at once.)
    let body = json!({"model": MODEL_ID, "prompt": "Who was Noah?", "think": false, "stream": false,
                      "options": {"temperature": 0, "num_predict": 8, "ignore_eos": true}});
    let r = s.post("/api/generate", &body);
    let v = r.json();
    assert_eq!(r.status, 200, "{v}");
    assert_final(&v, 8);
    let whole = v["response"].as_str().unwrap().to_string();
    assert!(v.get("thinking").is_none(), "{v}");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let lines = stream_lines(&s.post("/api/generate", &sb), 8);
    let streamed: String = lines
        .iter()
        .map(|l| l["response"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, whole);

    // Generate with thinking, a system prompt and stop strings.
    let r = s.post(
        "/api/generate",
        &json!({"model": MODEL_ID, "prompt": "Who was Noah?", "system": "Answer briefly.",
                "think": true, "stream": false, "keep_alive": "5m",
                "options": {"num_predict": 12, "stop": ["zzzz"], "top_k": 20, "top_p": 0.9, "ignore_eos": true,
                            "min_p": 0.05, "repeat_penalty": 1.1, "num_ctx": 8192}}),
    );
    let v = r.json();
    assert_eq!(r.status, 200, "{v}");
    assert!(!v["thinking"].as_str().unwrap_or("").is_empty(), "{v}");
    assert_final(&v, 12);

    // Raw: the prompt as given, no template; the counts show it (a few tokens only).
    let r = s.post(
        "/api/generate",
        &json!({"model": MODEL_ID, "prompt": "In the beginning", "raw": true, "stream": false,
                "options": {"num_predict": 5, "temperature": 0}}),
    );
    let v = r.json();
    assert_eq!(r.status, 200, "{v}");
    assert!(v["prompt_eval_count"].as_u64().unwrap() <= 5, "{v}");
    assert!(!v["response"].as_str().unwrap().is_empty());

    // format: "json" and a schema are taken (the engine applies them once constrained sampling is in).
    for format in [
        json!("json"),
        json!({"type": "object", "properties": {"a": {"type": "string"}}}),
    ] {
        let r = s.post(
            "/api/chat",
            &json!({"model": MODEL_ID, "messages": msgs("x"), "stream": false, "format": format,
                    "think": false, "options": {"num_predict": 4}}),
        );
        assert_eq!(r.status, 200, "{format}: {}", r.text);
    }

    // Tools, and a history with a call and its result in Ollama's shape.
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let history = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "Sunny, 22 degrees", "tool_name": "get_weather"},
    ]);
    let with = s.post(
        "/api/chat",
        &json!({"model": MODEL_ID, "messages": history, "tools": tools, "stream": false,
                "think": false, "options": {"num_predict": 6}}),
    );
    let v = with.json();
    assert_eq!(with.status, 200, "{v}");
    assert_final(&v, 6);
    if let Some(calls) = v["message"]["tool_calls"].as_array() {
        for c in calls {
            assert!(c["function"]["name"].is_string() && c["function"]["arguments"].is_object());
        }
    }
    // The call and its result reach the prompt: without them it is shorter.
    let without = s.post(
        "/api/chat",
        &json!({"model": MODEL_ID, "messages": [history[0].clone()], "tools": tools,
                "stream": false, "think": false, "options": {"num_predict": 1}}),
    );
    let w = without.json();
    let full = |v: &Value| v["prompt_eval_count"].as_u64().unwrap();
    assert!(
        full(&v) > full(&w) + 10,
        "{} vs {}",
        v["prompt_eval_count"],
        w["prompt_eval_count"]
    );

    // No messages / no prompt: Ollama's "load" answer.
    let v = s
        .post("/api/chat", &json!({"model": MODEL_ID, "messages": []}))
        .json();
    assert_eq!(v["done_reason"], "load");
    assert_eq!(v["done"], true);
    let v = s.post("/api/generate", &json!({"model": MODEL_ID})).json();
    assert_eq!(v["done_reason"], "load");
    assert_eq!(v["response"], "");

    assert_eq!(s.health()["requests"]["failed"], 0);
}

/// Malformed requests: all 4xx in Ollama's error shape, and the server keeps serving.
#[test]
fn malformed_requests() {
    let s = Server::start(&["-c", "1024"]);
    let chat = |extra: Value| {
        let mut b = json!({"model": MODEL_ID, "messages": msgs("x"), "stream": false});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let gen = |extra: Value| {
        let mut b = json!({"model": MODEL_ID, "prompt": "x", "stream": false});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let opt = |o: Value| chat(json!({"options": o}));
    let gopt = |o: Value| gen(json!({"options": o}));
    let msg = |m: Value| chat(json!({"messages": [m]}));
    let cases: Vec<(&str, String, u16)> = vec![
        ("/api/chat", "{not json".into(), 400),
        ("/api/chat", "".into(), 400),
        ("/api/chat", "[1, 2]".into(), 400),
        ("/api/chat", "\"chat\"".into(), 400),
        ("/api/chat", "{\"model\": \"x\"} trailing".into(), 400),
        ("/api/chat", json!({"messages": msgs("x")}).to_string(), 400),
        (
            "/api/chat",
            json!({"model": "", "messages": msgs("x")}).to_string(),
            400,
        ),
        (
            "/api/chat",
            json!({"model": 5, "messages": msgs("x")}).to_string(),
            400,
        ),
        (
            "/api/chat",
            json!({"model": "gpt-4o", "messages": msgs("x")}).to_string(),
            404,
        ),
        (
            "/api/chat",
            json!({"model": "qwen3.5:latest", "messages": msgs("x")}).to_string(),
            404,
        ),
        ("/api/chat", chat(json!({"messages": "hi"})), 400),
        (
            "/api/chat",
            chat(json!({"messages": {"role": "user"}})),
            400,
        ),
        ("/api/chat", chat(json!({"messages": [5]})), 400),
        ("/api/chat", msg(json!({"content": "x"})), 400),
        (
            "/api/chat",
            msg(json!({"role": "wizard", "content": "x"})),
            400,
        ),
        ("/api/chat", msg(json!({"role": 1, "content": "x"})), 400),
        ("/api/chat", msg(json!({"role": "user", "content": 5})), 400),
        (
            "/api/chat",
            msg(json!({"role": "user", "content": ["x"]})),
            400,
        ),
        (
            "/api/chat",
            msg(json!({"role": "user", "content": "x", "images": "abc"})),
            400,
        ),
        (
            "/api/chat",
            msg(json!({"role": "user", "content": "x", "images": [5]})),
            400,
        ),
        (
            "/api/chat",
            msg(json!({"role": "user", "content": "x", "images": ["aGVsbG8="]})),
            400,
        ),
        (
            "/api/chat",
            msg(json!({"role": "user", "content": "x", "images": ["@@@"]})),
            400,
        ),
        (
            "/api/chat",
            msg(
                json!({"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}),
            ),
            400,
        ),
        (
            "/api/chat",
            msg(json!({"role": "assistant", "content": "x", "tool_calls": [{"function": {}}]})),
            400,
        ),
        (
            "/api/chat",
            msg(
                json!({"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}),
            ),
            400,
        ),
        (
            "/api/chat",
            msg(
                json!({"role": "assistant", "content": "x", "tool_calls": {"function": {"name": "f"}}}),
            ),
            400,
        ),
        (
            "/api/chat",
            msg(json!({"role": "assistant", "thinking": 3})),
            400,
        ),
        ("/api/chat", chat(json!({"stream": "yes"})), 400),
        ("/api/chat", chat(json!({"think": "maybe"})), 400),
        ("/api/chat", chat(json!({"think": 1})), 400),
        ("/api/chat", chat(json!({"format": "xml"})), 400),
        ("/api/chat", chat(json!({"format": 5})), 400),
        ("/api/chat", chat(json!({"format": ["json"]})), 400),
        ("/api/chat", chat(json!({"tools": "get_weather"})), 400),
        (
            "/api/chat",
            chat(json!({"tools": [{"type": "function"}]})),
            400,
        ),
        (
            "/api/chat",
            chat(json!({"tools": [{"type": "retrieval", "function": {"name": "f"}}]})),
            400,
        ),
        (
            "/api/chat",
            chat(json!({"tools": [{"function": {"name": ""}}]})),
            400,
        ),
        ("/api/chat", chat(json!({"keep_alive": [1]})), 400),
        ("/api/chat", chat(json!({"options": "hot"})), 400),
        ("/api/chat", opt(json!({"temperature": "hot"})), 400),
        ("/api/chat", opt(json!({"temperature": -1})), 400),
        ("/api/chat", opt(json!({"temperature": 9})), 400),
        ("/api/chat", opt(json!({"top_p": 1.5})), 400),
        ("/api/chat", opt(json!({"top_k": -3})), 400),
        ("/api/chat", opt(json!({"top_k": 2.5})), 400),
        ("/api/chat", opt(json!({"min_p": 2})), 400),
        ("/api/chat", opt(json!({"num_predict": "ten"})), 400),
        ("/api/chat", opt(json!({"num_predict": -5})), 400),
        ("/api/chat", opt(json!({"num_ctx": 0})), 400),
        ("/api/chat", opt(json!({"num_ctx": "big"})), 400),
        ("/api/chat", opt(json!({"seed": "lucky"})), 400),
        ("/api/chat", opt(json!({"stop": 7})), 400),
        ("/api/chat", opt(json!({"stop": [1, 2]})), 400),
        ("/api/chat", opt(json!({"stop": vec!["s"; 17]})), 400),
        ("/api/chat", opt(json!({"repeat_penalty": -1})), 400),
        ("/api/chat", opt(json!({"repeat_last_n": -2})), 400),
        ("/api/chat", opt(json!({"presence_penalty": 3})), 400),
        ("/api/chat", opt(json!({"frequency_penalty": "x"})), 400),
        (
            "/api/chat",
            msg(json!({"role": "user", "content": "and it came to pass ".repeat(400)})),
            400,
        ),
        ("/api/generate", "{oops".into(), 400),
        ("/api/generate", json!({"prompt": "x"}).to_string(), 400),
        (
            "/api/generate",
            json!({"model": "nope", "prompt": "x"}).to_string(),
            404,
        ),
        ("/api/generate", gen(json!({"prompt": 5})), 400),
        ("/api/generate", gen(json!({"prompt": ["x"]})), 400),
        ("/api/generate", gen(json!({"system": 5})), 400),
        ("/api/generate", gen(json!({"raw": "yes"})), 400),
        (
            "/api/generate",
            gen(json!({"template": "{{ .Prompt }}"})),
            400,
        ),
        ("/api/generate", gen(json!({"suffix": "end"})), 400),
        ("/api/generate", gen(json!({"images": ["aGVsbG8="]})), 400),
        ("/api/generate", gen(json!({"images": "aGVsbG8="})), 400),
        ("/api/generate", gen(json!({"format": "yaml"})), 400),
        ("/api/generate", gen(json!({"think": "very"})), 400),
        ("/api/generate", gen(json!({"context": "abc"})), 400),
        ("/api/generate", gopt(json!({"temperature": 3})), 400),
        ("/api/generate", gopt(json!({"num_predict": -3})), 400),
        (
            "/api/generate",
            gen(json!({"raw": true, "prompt": "and it came to pass ".repeat(400)})),
            400,
        ),
        ("/api/show", "{}".into(), 400),
        ("/api/show", json!({"model": "missing"}).to_string(), 404),
        ("/api/show", json!({"model": 3}).to_string(), 400),
        ("/api/show", "nope".into(), 400),
        ("/api/pull", json!({"model": "x"}).to_string(), 404),
        (
            "/api/embed",
            json!({"model": MODEL_ID, "input": "x"}).to_string(),
            404,
        ),
    ];
    assert!(cases.len() >= 80, "{}", cases.len());
    for (path, body, want) in &cases {
        let r = s.post_text(path, body);
        assert_eq!(r.status, *want, "{path} {body}: {}", r.text);
        assert_ollama_error(&r, &format!("{path} {body}"));
    }
    // Wrong methods.
    for path in ["/api/chat", "/api/generate", "/api/show"] {
        let r = s.get(path);
        assert_eq!(r.status, 405, "GET {path}");
        assert_ollama_error(&r, path);
    }
    for path in ["/api/tags", "/api/version", "/api/ps"] {
        let r = s.post_text(path, "{}");
        assert_eq!(r.status, 405, "POST {path}");
        assert_ollama_error(&r, path);
    }
    // A body cut short.
    let (st, body) = s.raw(
        b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 8\r\nConnection: close\r\n\r\n{\"model\"",
    );
    assert_eq!(st, 400, "{body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string());

    // Still serving.
    let r = s.post(
        "/api/generate",
        &json!({"model": MODEL_ID, "prompt": "x", "stream": false, "options": {"num_predict": 2}}),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(s.health()["requests"]["failed"], 0);
}

/// A client that goes away mid-stream cancels its generation.
#[test]
fn disconnect_cancels() {
    let s = Server::start(&["-c", "4096"]);
    let body = json!({"model": MODEL_ID, "prompt": "Who was Moses?", "think": false,
                      "options": {"num_predict": 4000, "ignore_eos": true}})
    .to_string();
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        c,
        "POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    // Past the headers and the first piece of the answer.
    let mut pieces = 0;
    while pieces < 3 {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0);
        if line.contains("\"response\"") {
            pieces += 1;
        }
    }
    drop(r);
    drop(c);
    let t0 = Instant::now();
    loop {
        let h = s.health();
        if h["requests"]["cancelled"].as_u64().unwrap() >= 1 {
            assert_eq!(h["slots"]["busy"], 0);
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "not cancelled: {h}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With --api-key the Ollama endpoints want it too (as a bearer token, which Ollama clients send
/// through their headers option).
#[test]
fn api_key() {
    let s = Server::start(&["-c", "512", "--api-key", "sesame"]);
    for path in ["/api/tags", "/api/ps"] {
        let r = s.get(path);
        assert_eq!(r.status, 401, "{path}");
        assert_ollama_error(&r, path);
        assert_eq!(s.get_with_key(path, "sesamE").status, 401);
        assert_eq!(s.get_with_key(path, "sesame").status, 200);
    }
    let r = s.post(
        "/api/chat",
        &json!({"model": MODEL_ID, "messages": msgs("x"), "stream": false}),
    );
    assert_eq!(r.status, 401);
    assert_ollama_error(&r, "chat without the key");
}
