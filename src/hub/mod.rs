//! Getting models from Hugging Face, as `ollama pull` and llama.cpp's `-hf` do: `REPO[:QUANT]`
//! names a repository and a quantization ([`ModelRef`]), the repository listing says which files
//! that means ([`select`]), and each file is downloaded into the cache ([`Cache`]) with resume,
//! a progress bar and its SHA-256 checked against the hub's LFS record before it gets its name.
//!
//! `HF_ENDPOINT` replaces `https://huggingface.co`, `HF_TOKEN` is sent as a bearer token to it
//! (never to the CDN it redirects to), `DELTAQ_CACHE` places the cache, and offline use
//! (`--offline` or `HF_HUB_OFFLINE=1`) resolves names from the cache alone.

mod cache;
mod download;
mod http;
mod reference;
mod select;
mod space;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use cache::{Cache, CachedFile};
pub use reference::ModelRef;
pub use select::{quant_of, quants, select, RepoFile, Selection};

use download::{download_once, is_current, Outcome};
use http::{Failure, HubHttp};

/// The Hugging Face hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Why a pull failed, worded for the person who typed the command.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0}")]
    BadName(String),
    #[error("no cache folder: set DELTAQ_CACHE (or HOME)")]
    NoCacheDir,
    #[error("cannot reach {host}: {detail} (no network? --offline uses the models already in the cache)")]
    Network { host: String, detail: String },
    #[error(
        "{repo}: 401 Unauthorized: the repository is private, gated or does not exist; if you have \
         access to it, set HF_TOKEN to a Hugging Face access token"
    )]
    Unauthorized { repo: String },
    #[error(
        "{repo}: 403 Forbidden: the repository is gated; accept its conditions on its Hugging Face \
         page, then set HF_TOKEN to an access token of that account"
    )]
    Forbidden { repo: String },
    #[error("repository {repo} not found (404 from {url})")]
    RepoNotFound { repo: String, url: String },
    #[error("{file} not found (404) in repository {repo}")]
    RemoteFileNotFound { repo: String, file: String },
    #[error(
        "{repo} has no {quant} model file; its quantizations: {}",
        or_none(quants)
    )]
    QuantNotFound {
        repo: String,
        quant: String,
        quants: Vec<String>,
    },
    #[error("{repo} has no file {file}; its GGUF files: {}", or_none(files))]
    FileNotFound {
        repo: String,
        file: String,
        files: Vec<String>,
    },
    #[error("{repo} has no GGUF model file")]
    NoGguf { repo: String },
    #[error("{repo}: {file} is split into {count} parts but part {part} is not in the repository")]
    MissingPart {
        repo: String,
        file: String,
        part: u32,
        count: u32,
    },
    #[error(
        "{name} is not in the cache ({}){}; run without --offline to download it",
        cache.display(),
        cached_note(cached)
    )]
    NotCached {
        name: String,
        cache: PathBuf,
        cached: Vec<String>,
    },
    #[error(
        "download of {file} stopped at {done} of {size} bytes ({detail}); run the same command \
         again to resume"
    )]
    Interrupted {
        file: String,
        done: u64,
        size: u64,
        detail: String,
    },
    #[error(
        "checksum mismatch for {file}: the hub lists sha256 {expected}, the download has {actual}; \
         it was deleted, run the command again"
    )]
    Checksum {
        file: String,
        expected: String,
        actual: String,
    },
    #[error("{repo}: {file} changed on the hub while it was being fetched; run the command again")]
    Changed { repo: String, file: String },
    #[error(
        "disk full writing {} ({done} of {size} bytes): free {} and run the command again to \
         resume (or delete the .part file)",
        path.display(),
        human_bytes(size.saturating_sub(*done))
    )]
    DiskFull { path: PathBuf, done: u64, size: u64 },
    #[error(
        "not enough disk space for {name}: {} to download, {} free in {}; free some space or set \
         DELTAQ_CACHE to a folder on a larger disk",
        human_bytes(*need),
        human_bytes(*available),
        folder.display()
    )]
    NoSpace {
        name: String,
        folder: PathBuf,
        need: u64,
        available: u64,
    },
    #[error("{} is being downloaded by another deltaq process", path.display())]
    Busy { path: PathBuf },
    #[error("{url}: HTTP {status}")]
    Http { url: String, status: u16 },
    #[error("{url}: {detail}")]
    Protocol { url: String, detail: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

fn or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn cached_note(cached: &[String]) -> String {
    if cached.is_empty() {
        String::new()
    } else {
        format!("; cached from this repository: {}", cached.join(", "))
    }
}

/// `n` bytes in KiB/MiB/GiB.
pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

pub(crate) fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The files a [`ModelRef`] stands for, and where their description came from.
#[derive(Clone, Debug)]
pub struct Plan {
    pub model_ref: ModelRef,
    pub selection: Selection,
    /// Set when the files come from the cache only, saying why (offline, or the hub unreachable)
    pub from_cache: Option<String>,
}

impl Plan {
    /// Bytes of every file in the plan.
    pub fn total_bytes(&self) -> u64 {
        self.files().map(|f| f.size).sum()
    }

    fn files(&self) -> impl Iterator<Item = &RepoFile> {
        self.selection
            .model
            .iter()
            .chain(self.selection.mmproj.as_ref())
    }
}

/// Local paths of a pulled model.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// The model file, or every part of a split model in order
    pub model: Vec<PathBuf>,
    /// The vision projector, when the repository has one and it was asked for
    pub mmproj: Option<PathBuf>,
}

/// The hub, the cache, and how to reach them.
pub struct Hub {
    http: HubHttp,
    cache: Cache,
    /// Use the cache only
    pub offline: bool,
    /// Further attempts after a network failure or a 5xx, each resuming where the last stopped
    pub retries: u32,
    /// Wait before the first retry (doubling after each)
    pub retry_delay: Duration,
    /// Progress bars and retry notes on stderr
    pub progress: bool,
}

impl Hub {
    pub fn new(endpoint: &str, token: Option<String>, cache: Cache) -> Hub {
        Hub {
            http: HubHttp::new(endpoint, token),
            cache,
            offline: false,
            retries: 3,
            retry_delay: Duration::from_secs(1),
            progress: true,
        }
    }

    /// The hub of `HF_ENDPOINT` (default huggingface.co) with `HF_TOKEN`, the cache of
    /// `DELTAQ_CACHE` (default: `deltaq` in the user's cache folder); offline if `HF_HUB_OFFLINE`
    /// is set to 1.
    pub fn from_env() -> Result<Hub, PullError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let cache = Cache::from_env().ok_or(PullError::NoCacheDir)?;
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let token = var("HF_TOKEN").map(|t| t.trim().to_string());
        let mut hub = Hub::new(&endpoint, token, cache);
        hub.offline = var("HF_HUB_OFFLINE").is_some_and(|v| v == "1" || v == "true");
        Ok(hub)
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    pub fn endpoint(&self) -> &str {
        &self.http.endpoint
    }

    /// Which files `r` means: from the hub's listing, or from the cache when offline (or when the
    /// hub cannot be reached and the cache has them).
    pub fn plan(&self, r: &ModelRef, with_mmproj: bool) -> Result<Plan, PullError> {
        if self.offline {
            return self.plan_from_cache(r, with_mmproj, "offline".into());
        }
        let listing = self.with_retries(None, false, || self.http.list_files(&r.repo));
        match listing {
            Ok(files) => Ok(Plan {
                model_ref: r.clone(),
                selection: select(&files, r, with_mmproj)?,
                from_cache: None,
            }),
            Err(e @ PullError::Network { .. }) => {
                let why = format!("{e}; using the cached copy");
                self.plan_from_cache(r, with_mmproj, why).map_err(|_| e)
            }
            Err(e) => Err(e),
        }
    }

    fn plan_from_cache(
        &self,
        r: &ModelRef,
        with_mmproj: bool,
        why: String,
    ) -> Result<Plan, PullError> {
        let files = self.cache.files(&r.repo).map_err(|e| PullError::Io {
            context: format!("reading the cache {}", self.cache.root().display()),
            source: e,
        })?;
        match select(&files, r, with_mmproj) {
            Ok(selection) => Ok(Plan {
                model_ref: r.clone(),
                selection,
                from_cache: Some(why),
            }),
            Err(_) => Err(PullError::NotCached {
                name: r.to_string(),
                cache: self.cache.root().to_path_buf(),
                cached: files.into_iter().map(|f| f.path).collect(),
            }),
        }
    }

    /// Downloads what `plan` names that the cache does not already hold.
    pub fn fetch(&self, plan: &Plan) -> Result<Pulled, PullError> {
        let repo = &plan.model_ref.repo;
        if plan.from_cache.is_none() {
            self.check_space(plan)?;
        }
        let get = |f: &RepoFile| -> Result<PathBuf, PullError> {
            if plan.from_cache.is_some() {
                Ok(self.cache.path_of(repo, &f.path))
            } else {
                self.fetch_file(repo, f)
            }
        };
        let model = plan
            .selection
            .model
            .iter()
            .map(get)
            .collect::<Result<Vec<_>, _>>()?;
        let mmproj = plan.selection.mmproj.as_ref().map(get).transpose()?;
        Ok(Pulled { model, mmproj })
    }

    /// [`Hub::plan`] then [`Hub::fetch`].
    pub fn pull(&self, r: &ModelRef, with_mmproj: bool) -> Result<Pulled, PullError> {
        self.fetch(&self.plan(r, with_mmproj)?)
    }

    /// Fails before anything is written when the plan's files do not fit on the cache's disk.
    fn check_space(&self, plan: &Plan) -> Result<(), PullError> {
        let repo = &plan.model_ref.repo;
        let need: u64 = plan
            .files()
            .map(|f| {
                let dest = self.cache.path_of(repo, &f.path);
                if std::fs::metadata(&dest).is_ok_and(|m| m.len() == f.size) {
                    return 0; // most likely current: the download step checks its hash
                }
                let part_len = std::fs::metadata(cache::part(&dest)).map_or(0, |m| m.len());
                f.size.saturating_sub(part_len)
            })
            .fold(0u64, u64::saturating_add);
        let folder = self.cache.root();
        match space::available_bytes(folder) {
            Some(available) if need > available => Err(PullError::NoSpace {
                name: plan.model_ref.to_string(),
                folder: folder.to_path_buf(),
                need,
                available,
            }),
            _ => Ok(()),
        }
    }

    /// One file into the cache unless it is there already; its local path.
    fn fetch_file(&self, repo: &str, file: &RepoFile) -> Result<PathBuf, PullError> {
        let dest = self.cache.path_of(repo, &file.path);
        if is_current(&dest, file)? {
            return Ok(dest);
        }
        let bar = self.bar(file);
        loop {
            let attempt = self.with_retries(Some(&bar), true, || {
                download_once(&self.http, repo, file, &dest, &bar)
            });
            match attempt {
                Ok(Outcome::Done) => {
                    bar.finish_and_clear();
                    return Ok(dest);
                }
                // the part came from another version of the file, and is deleted now
                Ok(Outcome::StaleResume) => self.note(
                    &bar,
                    &format!(
                        "the partial download of {} did not match; starting over",
                        file.path
                    ),
                ),
                Err(e) => {
                    bar.abandon();
                    return Err(e);
                }
            }
        }
    }

    /// `f` until it succeeds, fails for good, or has failed `1 + retries` times; an unreachable
    /// host is retried only if `network_too` (a listing fails at once, the cache may serve).
    fn with_retries<T>(
        &self,
        bar: Option<&indicatif::ProgressBar>,
        network_too: bool,
        mut f: impl FnMut() -> Result<T, Failure>,
    ) -> Result<T, PullError> {
        let mut delay = self.retry_delay;
        let mut failures = 0;
        loop {
            match f() {
                Ok(v) => return Ok(v),
                Err(Failure::Retry(e @ PullError::Network { .. })) if !network_too => {
                    return Err(e)
                }
                Err(Failure::Retry(e)) if failures < self.retries => {
                    failures += 1;
                    let mut msg = String::new();
                    let _ = write!(msg, "{e}; retry {failures} of {}", self.retries);
                    if !delay.is_zero() {
                        let _ = write!(msg, " in {} s", delay.as_secs_f32());
                    }
                    match bar {
                        Some(b) => self.note(b, &msg),
                        None if self.progress => eprintln!("note: {msg}"),
                        None => {}
                    }
                    std::thread::sleep(delay);
                    delay *= 2;
                }
                Err(f) => return Err(f.into_error()),
            }
        }
    }

    fn note(&self, bar: &indicatif::ProgressBar, msg: &str) {
        if self.progress {
            bar.suspend(|| eprintln!("note: {msg}"));
        }
    }

    fn bar(&self, file: &RepoFile) -> indicatif::ProgressBar {
        let target = if self.progress {
            indicatif::ProgressDrawTarget::stderr()
        } else {
            indicatif::ProgressDrawTarget::hidden()
        };
        let bar = indicatif::ProgressBar::with_draw_target(Some(file.size), target);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} {wide_bar} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {eta}",
        ) {
            bar.set_style(style);
        }
        let name = Path::new(&file.path)
            .file_name()
            .map_or(file.path.clone(), |n| n.to_string_lossy().into_owned());
        bar.set_message(name);
        bar
    }
}
