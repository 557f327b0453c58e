use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use deltaq::model::KvType;
use deltaq::server::{serve, Config};

/// The bundled demo model, used when `-m` is not given.
const DEMO_MODEL: &str = "models/tiny-kjv-mtp-Q8_0.gguf";

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file (default: the bundled demo model; -hf downloads one)
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Context size in tokens per session (default: the model's training context)
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Requests generating at once (each on its own thread and session)
    #[arg(long, default_value_t = 2)]
    parallel: usize,
    /// Requests waiting beyond the parallel ones; more are refused with 503 and Retry-After
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Require `Authorization: Bearer KEY` (default: the DELTAQ_API_KEY environment variable, if set)
    #[arg(long = "api-key", env = "DELTAQ_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Memory for prompt-cache snapshots, in MiB (0: no prompt cache)
    #[arg(long = "cache-mb", default_value_t = 1024)]
    cache_mb: usize,
    /// Largest request body in bytes
    #[arg(long = "max-body", default_value_t = 4 << 20)]
    max_body: usize,
    /// Thinking off unless a request asks for it (chat_template_kwargs.enable_thinking)
    #[arg(long)]
    no_think: bool,
    /// Model id reported by /v1/models and expected in requests (default: the file name)
    #[arg(long)]
    alias: Option<String>,
    /// Threads for the matrix kernels (default: all cores)
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// KV cache type for keys and values: f16 (as llama.cpp), f32 (exact), q8_0 or q4_0 (blocks of 32)
    #[arg(long = "kv-type", value_name = "TYPE", default_value = "f16", value_parser = super::parse_kv_type)]
    kv_type: KvType,
    /// Seconds a shutdown waits for open connections
    #[arg(long, default_value_t = 10)]
    shutdown_timeout: u64,
    #[command(flatten)]
    draft: super::DraftArgs,
    #[command(flatten)]
    rope: super::RopeArgs,
    #[command(flatten)]
    hub: super::pull::HubArgs,
    /// Vision tower GGUF (mmproj) of the model: chat messages may then hold image_url parts
    #[arg(long, value_name = "FILE")]
    mmproj: Option<PathBuf>,
    /// Fewest tokens an image becomes (one token = 32 × 32 pixels; default: the mmproj's, else 64)
    #[arg(long = "image-min-tokens", value_name = "N")]
    image_min_tokens: Option<usize>,
    /// Most tokens an image becomes (default: the mmproj's, else 4096)
    #[arg(long = "image-max-tokens", value_name = "N")]
    image_max_tokens: Option<usize>,
    /// Do not serve the chat page at / (the API only)
    #[arg(long = "no-webui")]
    no_webui: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let pulled = a.hub.model_path(a.model.as_ref(), true)?;
    let model_path = match pulled.or(a.model) {
        Some(p) => p,
        None => [
            PathBuf::from(DEMO_MODEL),
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(DEMO_MODEL),
        ]
        .into_iter()
        .find(|p| p.exists())
        .with_context(|| format!("no -m given and the demo model {DEMO_MODEL} was not found"))?,
    };
    if let Some(t) = a.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()
            .context("configuring the thread pool")?;
    }
    serve(Config {
        model_path,
        host: a.host,
        port: a.port,
        n_ctx: a.ctx_size,
        kv_type: a.kv_type,
        parallel: a.parallel.max(1),
        queue: a.queue,
        api_key: a.api_key,
        cache_bytes: a.cache_mb.saturating_mul(1 << 20),
        max_body: a.max_body,
        default_thinking: !a.no_think,
        model_id: a.alias,
        shutdown_timeout: Duration::from_secs(a.shutdown_timeout),
        draft: a.draft.settings(),
        rope: a.rope.overrides(),
        mmproj_path: a.mmproj,
        image_min_tokens: a.image_min_tokens,
        image_max_tokens: a.image_max_tokens,
        webui: !a.no_webui,
    })
}
