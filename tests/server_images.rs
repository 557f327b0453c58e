//! `deltaq serve --mmproj` over loopback with tiny-v1 (the fixture's random Qwen3.5 vision-language
//! model): OpenAI image content parts as data URLs, the prompt cache keyed by the image's content, and
//! 400s in the OpenAI error shape for malformed parts (the server stays up).
//!
//! The fixtures are copied (not committed) by `tools/fetch-fixtures.sh` into tests/fixtures/shared/.

mod common;

use std::path::PathBuf;
use std::process::Child;

use serde_json::{json, Value};

fn fixture(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/shared/tiny-v1")
        .join(rel);
    assert!(
        p.exists(),
        "missing test fixture {}: run tools/fetch-fixtures.sh (copies it from ../shared/fixtures)",
        p.display()
    );
    p.display().to_string()
}

struct Server {
    child: Child,
    base: String,
    agent: ureq::Agent,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let (child, addr, agent) = common::spawn_serve(args);
        Server {
            child,
            base: format!("http://{addr}"),
            agent,
        }
    }

    fn health(&self) -> Value {
        let mut r = self
            .agent
            .get(&format!("{}/health", self.base))
            .call()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
    }

    fn chat(&self, body: &Value) -> (u16, Value) {
        let mut r = self
            .agent
            .post(&format!("{}/v1/chat/completions", self.base))
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .unwrap();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?} (status {status})"));
        (status, v)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in bytes.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

fn png_url(i: usize) -> String {
    let bytes = std::fs::read(fixture(&format!("images/img{i}.png"))).unwrap();
    format!("data:image/png;base64,{}", base64(&bytes))
}

fn image_chat(url: &str) -> Value {
    json!({
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "Describe."},
        ]}],
        "max_tokens": 8,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": false},
    })
}

fn tiny_v1(extra: &[&str]) -> Server {
    let (m, mm) = (
        fixture("tiny-v1-F32.gguf"),
        fixture("mmproj-tiny-v1-F32.gguf"),
    );
    let mut args = vec!["-m", &m, "--mmproj", &mm];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// The error shape of a 400: `{"error": {"message", "type": "invalid_request_error", "param", "code"}}`.
fn assert_400(label: &str, (status, v): (u16, Value), want: &str) {
    assert_eq!(status, 400, "{label}: {v}");
    let e = &v["error"];
    assert_eq!(e["type"], "invalid_request_error", "{label}: {v}");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(msg.contains(want), "{label}: {msg}");
}

#[test]
fn image_requests_answer_and_cache_by_content() {
    let s = tiny_v1(&[]);
    assert_eq!(s.health()["images"], true);

    let (st, a) = s.chat(&image_chat(&png_url(0)));
    assert_eq!(st, 200, "{a}");
    let n_prompt = a["usage"]["prompt_tokens"].as_u64().unwrap();
    // 70 image tokens, the text and the template's framing.
    assert!(n_prompt > 80, "{a}");
    assert_eq!(a["usage"]["completion_tokens"], 8, "{a}");
    assert_eq!(a["timings"]["cached_n"], 0, "{a}");

    // The same request again: the whole prompt comes from the cache, the answer is the same.
    let (st, b) = s.chat(&image_chat(&png_url(0)));
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["timings"]["cached_n"].as_u64().unwrap(), n_prompt, "{b}");
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);

    // The same text with another image of the same size (70 tokens): nothing from the image on is
    // reused (the first image token is at index 5: `<|im_start|>user\n<|vision_start|>`), and the
    // answer differs.
    let (st, c) = s.chat(&image_chat(&png_url(1)));
    assert_eq!(st, 200, "{c}");
    assert_eq!(
        c["usage"]["prompt_tokens"].as_u64().unwrap(),
        n_prompt,
        "{c}"
    );
    assert!(c["timings"]["cached_n"].as_u64().unwrap() <= 5, "{c}");
    assert_ne!(a["choices"][0]["message"], c["choices"][0]["message"]);
}

#[test]
fn malformed_image_parts_are_400() {
    let s = tiny_v1(&[]);
    assert_400(
        "remote",
        s.chat(&image_chat("https://example.com/a.png")),
        "remote image URLs are not fetched",
    );
    assert_400(
        "bad base64",
        s.chat(&image_chat("data:image/png;base64,@@@@")),
        "bad base64",
    );
    assert_400(
        "not an image",
        s.chat(&image_chat(&format!(
            "data:image/png;base64,{}",
            base64(b"hello, world")
        ))),
        "unrecognised image format",
    );
    assert_400(
        "truncated png",
        s.chat(&image_chat(&png_url(0)[..400])),
        "image 0",
    );
    assert_400(
        "gif",
        s.chat(&image_chat("data:image/gif;base64,R0lGODlh")),
        "not supported",
    );
    assert_400(
        "no url",
        s.chat(&json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"uri": "x"}}]}]})),
        "image_url",
    );
    // Still up, and still answering.
    assert_eq!(s.health()["status"], "ok");
    assert_eq!(s.chat(&image_chat(&png_url(2))).0, 200);
}

#[test]
fn image_part_without_mmproj_is_400() {
    let m = fixture("tiny-v1-F32.gguf");
    let s = Server::start(&["-m", &m]);
    assert_eq!(s.health()["images"], false);
    assert_400(
        "no mmproj",
        s.chat(&image_chat(&png_url(0))),
        "start it with --mmproj",
    );
    assert_eq!(s.health()["status"], "ok");
}
