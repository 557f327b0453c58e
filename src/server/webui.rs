//! The chat page at `/` (plain HTML, CSS and JS embedded in the binary: no CDN, no build step) and
//! `GET /props`, which tells the page (and any client) what the server can do.

use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::AppState;
use crate::sampling::SamplingParams;

/// One embedded file of the page.
struct Asset {
    body: &'static [u8],
    content_type: &'static str,
    /// A strong validator of the body: browsers revalidate (`no-cache`) and get a 304 when unchanged,
    /// so a new binary's page is never mixed with an old cached script.
    etag: OnceLock<String>,
}

macro_rules! asset {
    ($file:literal, $type:literal) => {
        Asset {
            body: include_bytes!(concat!("webui/", $file)),
            content_type: $type,
            etag: OnceLock::new(),
        }
    };
}

static INDEX: Asset = asset!("index.html", "text/html; charset=utf-8");
static APP_JS: Asset = asset!("app.js", "text/javascript; charset=utf-8");
static STYLE: Asset = asset!("style.css", "text/css; charset=utf-8");
static ICON: Asset = asset!("icon.svg", "image/svg+xml");

impl Asset {
    /// The body's ETag, computed on first use.
    fn etag(&self) -> &str {
        self.etag.get_or_init(|| etag_of(self.body))
    }
}

fn etag_of(body: &[u8]) -> String {
    let d = Sha256::digest(body);
    let hex: String = d[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// The page's scripts and styles come from this server only, and model output is never markup: the
/// policy makes an injection that slipped through inert.
const CSP: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The routes of the page's files (`/props` is served either way).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(|h: HeaderMap| async move { serve(&INDEX, &h) }))
        .route(
            "/webui/app.js",
            get(|h: HeaderMap| async move { serve(&APP_JS, &h) }),
        )
        .route(
            "/webui/style.css",
            get(|h: HeaderMap| async move { serve(&STYLE, &h) }),
        )
        .route(
            "/webui/icon.svg",
            get(|h: HeaderMap| async move { serve(&ICON, &h) }),
        )
}

fn serve(a: &'static Asset, req: &HeaderMap) -> Response {
    let etag = a.etag();
    let fresh = req
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut r = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(a.content_type),
            )],
            a.body,
        )
            .into_response()
    };
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// `GET /props`: what the server offers, after llama.cpp's endpoint of that name. Public like
/// `/health`, which reports the same facts.
#[derive(Debug, Serialize)]
pub struct Props {
    pub model: String,
    pub n_ctx: usize,
    pub modalities: Modalities,
    /// Whether `/v1/chat/completions` works (the model has a usable chat template).
    pub chat: bool,
    /// `enable_thinking` when a request does not say (`--no-think` turns it off).
    pub default_thinking: bool,
    /// The sampling a chat request gets for the fields it leaves out, by thinking mode.
    pub default_sampling: DefaultSampling,
    /// Whether requests need `Authorization: Bearer KEY`.
    pub api_key_required: bool,
    /// Whether the chat page is served at `/`.
    pub webui: bool,
}

#[derive(Debug, Serialize)]
pub struct Modalities {
    pub vision: bool,
}

#[derive(Debug, Serialize)]
pub struct DefaultSampling {
    pub thinking: SamplingDefaults,
    pub no_thinking: SamplingDefaults,
}

#[derive(Debug, Serialize)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub presence_penalty: f32,
}

impl From<SamplingParams> for SamplingDefaults {
    fn from(p: SamplingParams) -> SamplingDefaults {
        SamplingDefaults {
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: p.top_k,
            min_p: p.min_p,
            presence_penalty: p.presence_penalty,
        }
    }
}

pub async fn props(State(st): State<Arc<AppState>>) -> Response {
    let props = Props {
        model: st.model_id.clone(),
        n_ctx: st.engine.n_ctx,
        modalities: Modalities {
            vision: st.images.is_some(),
        },
        chat: st.template.is_some(),
        default_thinking: st.default_thinking,
        default_sampling: DefaultSampling {
            thinking: SamplingParams::qwen35(true).into(),
            no_thinking: SamplingParams::qwen35(false).into(),
        },
        api_key_required: st.api_key.is_some(),
        webui: st.webui,
    };
    match serde_json::to_string(&props) {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_follows_the_content() {
        assert_eq!(etag_of(b"a"), etag_of(b"a"));
        assert_ne!(etag_of(b"a"), etag_of(b"b"));
        assert!(etag_of(b"a").starts_with('"') && etag_of(b"a").len() == 18);
    }

    #[test]
    fn page_references_only_embedded_files() {
        let html = std::str::from_utf8(INDEX.body).unwrap();
        for path in ["/webui/app.js", "/webui/style.css", "/webui/icon.svg"] {
            assert!(html.contains(path), "index.html does not load {path}");
        }
        // Nothing from elsewhere: the page must work offline.
        assert!(!html.contains("http://") && !html.contains("https://"));
        let js = std::str::from_utf8(APP_JS.body).unwrap();
        assert!(
            !js.contains("innerHTML"),
            "model output must never be markup"
        );
    }
}
