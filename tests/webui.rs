//! The chat page of `deltaq serve` and `GET /props`: the built binary on an ephemeral port, driven by
//! ureq. The page itself runs in a browser in tools/webui_test.py (CI); here: what the server sends.

mod common;

use std::path::PathBuf;
use std::process::Child;

use serde_json::Value;

use common::MODEL;

struct Server {
    child: Child,
    base: String,
    agent: ureq::Agent,
}

/// A response: status, headers we look at, body.
struct Got {
    status: u16,
    content_type: String,
    etag: Option<String>,
    headers: ureq::http::HeaderMap,
    body: String,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let mut args = vec!["-c", "256"];
        args.extend_from_slice(extra);
        let (child, addr, agent) = common::spawn_serve(&args);
        Server {
            child,
            base: format!("http://{addr}"),
            agent,
        }
    }

    fn get_with(&self, path: &str, if_none_match: Option<&str>) -> Got {
        let mut req = self.agent.get(&format!("{}{path}", self.base));
        if let Some(tag) = if_none_match {
            req = req.header("If-None-Match", tag);
        }
        let mut r = req.call().unwrap();
        let header = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let content_type = header("content-type").unwrap_or_default();
        let etag = header("etag");
        let headers = r.headers().clone();
        Got {
            status: r.status().as_u16(),
            content_type,
            etag,
            headers,
            body: r.body_mut().read_to_string().unwrap(),
        }
    }

    fn get(&self, path: &str) -> Got {
        self.get_with(path, None)
    }

    fn json(&self, path: &str) -> (u16, Value) {
        let g = self.get(path);
        let v = serde_json::from_str(&g.body)
            .unwrap_or_else(|e| panic!("{path} answered no JSON ({e}): {}", g.body));
        (g.status, v)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn assert_not_found(s: &Server, path: &str) {
    let (status, v) = s.json(path);
    assert_eq!(status, 404, "{path}");
    assert_eq!(v["error"]["type"], "not_found_error", "{path}: {v}");
    assert!(v["error"]["message"].is_string(), "{path}: {v}");
}

#[test]
fn page_assets_and_props() {
    let s = Server::start(&["-m", MODEL]);

    let page = s.get("/");
    assert_eq!(page.status, 200);
    assert_eq!(page.content_type, "text/html; charset=utf-8");
    assert!(page.body.starts_with("<!doctype html>"));
    assert!(page.body.contains("name=\"viewport\""));
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert_eq!(page.headers["x-content-type-options"], "nosniff");
    assert_eq!(page.headers["cache-control"], "no-cache");

    // Every file the page loads is served with its type, and revalidates to a 304 while unchanged.
    for (path, ty) in [
        ("/webui/app.js", "text/javascript; charset=utf-8"),
        ("/webui/style.css", "text/css; charset=utf-8"),
        ("/webui/icon.svg", "image/svg+xml"),
        ("/", "text/html; charset=utf-8"),
    ] {
        assert!(
            path == "/" || page.body.contains(path),
            "the page does not load {path}"
        );
        let g = s.get(path);
        assert_eq!(g.status, 200, "{path}");
        assert_eq!(g.content_type, ty, "{path}");
        assert!(!g.body.is_empty(), "{path}");
        let tag = g.etag.unwrap_or_else(|| panic!("{path} has no ETag"));
        let again = s.get_with(path, Some(&tag));
        assert_eq!(again.status, 304, "{path} with If-None-Match");
        assert!(again.body.is_empty());
        let changed = s.get_with(path, Some("\"0000000000000000\""));
        assert_eq!(changed.status, 200, "{path} with a stale ETag");
    }
    assert_not_found(&s, "/webui/missing.js");

    let (status, p) = s.json("/props");
    assert_eq!(status, 200);
    assert_eq!(p["model"], "tiny-kjv-mtp-Q8_0");
    assert_eq!(p["n_ctx"], 256);
    assert_eq!(p["modalities"]["vision"], false);
    assert_eq!(p["chat"], true);
    assert_eq!(p["default_thinking"], true);
    assert_eq!(p["api_key_required"], false);
    assert_eq!(p["webui"], true);
    assert_eq!(p["default_sampling"]["thinking"]["top_k"], 20);
    assert_eq!(p["default_sampling"]["no_thinking"]["temperature"], 0.7);
}

#[test]
fn no_webui_is_api_only_and_props_stay_public() {
    let s = Server::start(&["-m", MODEL, "--no-webui", "--api-key", "k", "--no-think"]);
    assert_not_found(&s, "/");
    assert_not_found(&s, "/webui/app.js");
    // /props tells a client what it needs before it has the key, like /health.
    let (status, p) = s.json("/props");
    assert_eq!(status, 200);
    assert_eq!(p["webui"], false);
    assert_eq!(p["api_key_required"], true);
    assert_eq!(p["default_thinking"], false);
    // The API itself still wants the key.
    assert_eq!(s.json("/v1/models").0, 401);
}

#[test]
fn props_report_vision_with_an_mmproj() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shared/tiny-v1");
    let (model, mmproj) = (
        dir.join("tiny-v1-F32.gguf"),
        dir.join("mmproj-tiny-v1-F32.gguf"),
    );
    assert!(
        mmproj.exists(),
        "missing test fixture {}: run tools/fetch-fixtures.sh",
        mmproj.display()
    );
    let s = Server::start(&[
        "-m",
        model.to_str().unwrap(),
        "--mmproj",
        mmproj.to_str().unwrap(),
    ]);
    let (status, p) = s.json("/props");
    assert_eq!(status, 200);
    assert_eq!(p["modalities"]["vision"], true);
    assert_eq!(s.get("/").status, 200);
}
