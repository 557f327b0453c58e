//! `deltaq serve`: an OpenAI-compatible HTTP server (axum on a small tokio runtime; generation on
//! dedicated OS threads, see [`engine`]), with a prompt cache of session snapshots ([`cache`]).
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (both streaming over SSE or not),
//! `GET /v1/models`, `GET /health`, `GET /props`, `POST /tokenize`, `POST /detokenize`; Ollama's API
//! under `/api` ([`ollama`]); and the chat page at `/` ([`webui`]).

pub mod api;
pub mod cache;
pub mod engine;
pub mod ollama;
pub mod text;
pub mod webui;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use crate::chat::ChatTemplate;
use crate::gguf::GgufFile;
use crate::model::{DraftSettings, KvType, Model, RopeOverrides};
use crate::tokenizer::Tokenizer;
use crate::vision::encoder::ImageEncoder;
use engine::Engine;

/// Server settings (the command line's flags).
#[derive(Clone, Debug)]
pub struct Config {
    pub model_path: PathBuf,
    pub host: String,
    /// 0: any free port (the chosen address is printed).
    pub port: u16,
    /// Context size per session (`None`: the model's training context).
    pub n_ctx: Option<usize>,
    /// KV cache element type of every session (and so of the prompt-cache snapshots).
    pub kv_type: KvType,
    /// Sessions generating at once.
    pub parallel: usize,
    /// Requests waiting beyond those; more get 503.
    pub queue: usize,
    pub api_key: Option<String>,
    /// Prompt cache capacity in bytes.
    pub cache_bytes: usize,
    /// Largest request body in bytes.
    pub max_body: usize,
    /// `enable_thinking` when a request does not say.
    pub default_thinking: bool,
    /// The model id reported by `/v1/models` (default: the file name without `.gguf`).
    pub model_id: Option<String>,
    /// How long a shutdown waits for open connections after stopping the generations.
    pub shutdown_timeout: Duration,
    /// Drafting with the model's MTP block (`--draft` and friends).
    pub draft: DraftSettings,
    /// RoPE scaling flags over the file's settings (`--rope-scaling` and friends).
    pub rope: RopeOverrides,
    /// The vision tower GGUF for image input, and the image token limits (default: the file's).
    pub mmproj_path: Option<PathBuf>,
    pub image_min_tokens: Option<usize>,
    pub image_max_tokens: Option<usize>,
    /// Serve the chat page at `/` (`--no-webui` turns it off).
    pub webui: bool,
}

/// What the handlers share.
pub struct AppState {
    pub engine: Arc<Engine>,
    pub template: Option<ChatTemplate>,
    pub model_id: String,
    pub api_key: Option<String>,
    pub default_thinking: bool,
    pub created: u64,
    pub started: std::time::Instant,
    /// The vision tower (`--mmproj`): chat messages may hold images.
    pub images: Option<&'static ImageEncoder<'static>>,
    /// The chat page is served at `/`.
    pub webui: bool,
    /// What the Ollama API says about the model.
    pub ollama: ollama::ModelCard,
}

/// Loads the model, binds and serves until SIGINT/SIGTERM.
pub fn serve(cfg: Config) -> anyhow::Result<()> {
    let file = GgufFile::open(&cfg.model_path)
        .with_context(|| format!("opening {}", cfg.model_path.display()))?;
    // The server lives as long as the process: the mapping, weights and tokenizer are leaked so that
    // sessions and snapshots can be moved between threads without lifetimes.
    let file: &'static GgufFile = Box::leak(Box::new(file));
    let mut model =
        Model::load(file).with_context(|| format!("loading {}", cfg.model_path.display()))?;
    model.hp.set_rope(&cfg.rope)?;
    model.hp.check_kv_type(cfg.kv_type)?;
    let model: &'static Model<'static> = Box::leak(Box::new(model));
    let tok = Tokenizer::from_gguf(file)
        .with_context(|| format!("tokenizer of {}", cfg.model_path.display()))?;
    let tok: &'static Tokenizer = Box::leak(Box::new(tok));
    let template = match ChatTemplate::from_gguf(file) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("note: no usable chat template ({e}); /v1/chat/completions is disabled");
            None
        }
    };
    let card = ollama::ModelCard::new(file, &cfg.model_path);
    file.release_metadata_pages();
    let images = match &cfg.mmproj_path {
        Some(p) => {
            let f = crate::vision::mmproj::open(p)
                .with_context(|| format!("opening the mmproj {}", p.display()))?;
            let f: &'static GgufFile = Box::leak(Box::new(f));
            let enc = ImageEncoder::new(
                f,
                model.hp.n_embd,
                cfg.image_min_tokens,
                cfg.image_max_tokens,
            )
            .with_context(|| format!("mmproj {}", p.display()))?;
            tok.special_id("<|image_pad|>")
                .context("the model's vocabulary has no <|image_pad|> token: it takes no images")?;
            Some(&*Box::leak(Box::new(enc)))
        }
        None if cfg.image_min_tokens.is_some() || cfg.image_max_tokens.is_some() => {
            bail!("--image-min-tokens / --image-max-tokens need --mmproj")
        }
        None => None,
    };
    let n_ctx = cfg.n_ctx.unwrap_or(model.hp.n_ctx_train);
    model.hp.check_ctx(n_ctx)?;
    if n_ctx == 0 {
        bail!("the context size must be at least 1");
    }
    let model_id = cfg.model_id.clone().unwrap_or_else(|| {
        cfg.model_path
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| "deltaq".into())
    });
    let (drafter, note) = cfg.draft.drafter(model);
    if let Some(n) = note {
        eprintln!("note: {n}");
    }
    let engine = Engine::start(
        model,
        tok,
        n_ctx,
        cfg.kv_type,
        cfg.parallel,
        cfg.queue,
        cfg.cache_bytes,
        drafter,
    );
    let state = Arc::new(AppState {
        engine: engine.clone(),
        template,
        model_id,
        api_key: cfg.api_key.clone().filter(|k| !k.is_empty()),
        default_thinking: cfg.default_thinking,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        started: std::time::Instant::now(),
        images,
        webui: cfg.webui,
        ollama: card,
    });
    let app = router(state, cfg.max_body, cfg.webui);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("deltaq-http")
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port))
            .await
            .with_context(|| format!("binding {}:{}", cfg.host, cfg.port))?;
        let addr: SocketAddr = listener.local_addr()?;
        eprintln!(
            "deltaq serve: {} on http://{addr} (context {n_ctx}, KV cache {}, {} parallel, queue {}, cache {} MiB)",
            cfg.model_path.display(),
            cfg.kv_type,
            engine.parallel,
            engine.queue_capacity,
            cfg.cache_bytes >> 20
        );
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let eng = engine.clone();
        let signal = async move {
            shutdown_signal().await;
            eprintln!("deltaq serve: shutting down");
            // Running generations end now (their clients get a proper end of stream); then the
            // server waits for the connections to close.
            eng.stopping.store(true, Ordering::SeqCst);
            let _ = stop_tx.send(());
        };
        let server = axum::serve(listener, app).with_graceful_shutdown(signal);
        let timeout = cfg.shutdown_timeout;
        tokio::select! {
            r = server => r.context("serving")?,
            _ = async move {
                let _ = stop_rx.await;
                tokio::time::sleep(timeout).await;
            } => eprintln!("deltaq serve: connections still open after {timeout:?}; exiting"),
        }
        eprintln!("deltaq serve: stopped");
        anyhow::Ok(())
    })
}

fn router(state: Arc<AppState>, max_body: usize, webui: bool) -> Router {
    Router::new()
        .route("/health", get(api::health))
        .route("/v1/health", get(api::health))
        .route("/v1/models", get(api::models))
        .route("/models", get(api::models))
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/chat/completions", post(api::chat_completions))
        .route("/v1/completions", post(api::completions))
        .route("/completions", post(api::completions))
        .route("/tokenize", post(api::tokenize))
        .route("/detokenize", post(api::detokenize))
        .route("/props", get(webui::props))
        .merge(if webui {
            webui::routes()
        } else {
            Router::new()
        })
        .nest("/api", ollama::routes())
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
