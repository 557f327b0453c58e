//! `deltaq pull`, `-hf` and `deltaq list` against a local stand-in for the Hugging Face hub: the
//! tree listing (in two pages), `resolve/main` redirecting to a "CDN" on another port (and, for the
//! mmproj, to a path on the hub itself), `X-Linked-Etag`, Range requests, and faults on demand (a
//! connection dropped after N bytes, a corrupted byte, a required token). Loopback only; each
//! server stops when its test ends, and after a minute in any case. No test touches the internet.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use deltaq::hub::{Cache, Hub, ModelRef, PullError};
use sha2::{Digest, Sha256};

const REPO: &str = "test-org/tiny-kjv-GGUF";
const MODEL_FILE: &str = "tiny-kjv-mtp-Q8_0.gguf";
const MMPROJ_FILE: &str = "mmproj-tiny-kjv-F16.gguf";

fn demo_model() -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models")
            .join(MODEL_FILE),
    )
    .unwrap()
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A request the server saw.
#[derive(Clone, Debug)]
struct Seen {
    server: &'static str,
    path: String,
    range: Option<String>,
    auth: Option<String>,
}

/// What the server does wrong, on demand.
#[derive(Default)]
struct Faults {
    /// The next CDN download sends this many bytes of the body, then closes the connection
    drop_after: Option<usize>,
    /// Every CDN download has this byte flipped
    corrupt_at: Option<usize>,
    /// Requests to the hub without `Authorization: Bearer TOKEN` get 401
    token: Option<String>,
    /// Every hub request gets this status instead
    status: Option<u16>,
    /// The listing gives the model file this size instead of its own
    listed_size: Option<u64>,
}

struct State {
    files: Vec<(String, Vec<u8>)>,
    cdn: String,
    seen: Mutex<Vec<Seen>>,
    faults: Mutex<Faults>,
}

/// The stand-in hub (and its CDN on a second port).
struct FakeHub {
    url: String,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl FakeHub {
    fn start() -> FakeHub {
        let mmproj: Vec<u8> = b"GGUF not a real projector: the pull only moves bytes"
            .iter()
            .copied()
            .cycle()
            .take(70_001)
            .collect();
        let files = vec![
            ("README.md".to_string(), b"# tiny\n".to_vec()),
            (MODEL_FILE.to_string(), demo_model()),
            ("tiny-kjv-mtp-F16.gguf".to_string(), vec![7u8; 1234]),
            (MMPROJ_FILE.to_string(), mmproj),
        ];
        let hub = TcpListener::bind("127.0.0.1:0").unwrap();
        let cdn = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", hub.local_addr().unwrap());
        let state = Arc::new(State {
            files,
            cdn: format!("http://{}", cdn.local_addr().unwrap()),
            seen: Mutex::new(Vec::new()),
            faults: Mutex::new(Faults::default()),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [("hub", hub), ("cdn", cdn)]
            .into_iter()
            .map(|(name, l)| {
                let (state, stop) = (state.clone(), stop.clone());
                std::thread::spawn(move || serve(name, l, &state, &stop))
            })
            .collect();
        FakeHub {
            url,
            state,
            stop,
            threads,
        }
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.state.faults.lock().unwrap()
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    fn cdn_requests(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.server == "cdn")
            .collect()
    }

    fn file(&self, path: &str) -> &[u8] {
        &self.state.files.iter().find(|(p, _)| p == path).unwrap().1
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Accepts connections one at a time (each carries one request) until told to stop or a minute
/// has passed.
fn serve(name: &'static str, l: TcpListener, state: &State, stop: &AtomicBool) {
    l.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        match l.accept() {
            Ok((s, _)) => {
                let _ = handle(name, s, state);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn handle(name: &'static str, mut s: TcpStream, state: &State) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 << 10 || s.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let target = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("/")
        .to_string();
    let header = |k: &str| {
        head.split("\r\n").skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(k).then(|| v.trim().to_string())
        })
    };
    let seen = Seen {
        server: name,
        path: target.clone(),
        range: header("range"),
        auth: header("authorization"),
    };
    state.seen.lock().unwrap().push(seen.clone());
    let faults = state.faults.lock().unwrap();
    if name == "hub" {
        if let Some(st) = faults.status {
            return respond(&mut s, st, &[], b"{\"error\":\"no\"}");
        }
        if let Some(t) = &faults.token {
            if seen.auth.as_deref() != Some(&format!("Bearer {t}")) {
                return respond(&mut s, 401, &[], b"{\"error\":\"Invalid credentials\"}");
            }
        }
    }
    drop(faults);
    let listing = format!("/api/models/{REPO}/tree/main?recursive=true");
    let resolve = format!("/{REPO}/resolve/main/");
    if name == "hub" && target.starts_with(&listing) {
        // two pages, as the hub pages long listings
        let second = target.ends_with("&cursor=2");
        let mut entries: Vec<String> = Vec::new();
        if !second {
            entries.push(r#"{"type":"directory","oid":"0","size":0,"path":"docs"}"#.into());
        }
        let listed_size = state.faults.lock().unwrap().listed_size;
        for (i, (path, data)) in state.files.iter().enumerate() {
            if (i >= 2) != second {
                continue;
            }
            let size = match listed_size {
                Some(n) if path == MODEL_FILE => n,
                _ => data.len() as u64,
            };
            entries.push(if path.ends_with(".gguf") {
                format!(
                    r#"{{"type":"file","oid":"{}","size":{},"path":"{path}","lfs":{{"oid":"{}","size":{},"pointerSize":134}}}}"#,
                    &sha256_hex(path.as_bytes())[..40],
                    size,
                    sha256_hex(data),
                    size
                )
            } else {
                format!(
                    r#"{{"type":"file","oid":"{}","size":{},"path":"{path}"}}"#,
                    &sha256_hex(data)[..40],
                    data.len()
                )
            });
        }
        let body = format!("[{}]", entries.join(","));
        let link = format!("Link: <{listing}&cursor=2>; rel=\"next\"");
        let headers: Vec<&str> = if second { vec![] } else { vec![&link] };
        return respond(&mut s, 200, &headers, body.as_bytes());
    }
    if name == "hub" && target.starts_with(&resolve) {
        let path = &target[resolve.len()..];
        let Some((_, data)) = state.files.iter().find(|(p, _)| p == path) else {
            return respond(&mut s, 404, &[], b"Entry not found");
        };
        let sha = sha256_hex(data);
        // the model goes to the CDN on the other port; the mmproj to a path on the hub
        let location = if path == MODEL_FILE {
            format!("Location: {}/blob/{sha}?sig=abc", state.cdn)
        } else {
            format!("Location: /blob/{sha}")
        };
        let etag = format!("X-Linked-Etag: \"{sha}\"");
        let size = format!("X-Linked-Size: {}", data.len());
        return respond(&mut s, 302, &[&location, &etag, &size, "ETag: \"x\""], b"");
    }
    if let Some(rest) = target.strip_prefix("/blob/") {
        let sha = rest.split('?').next().unwrap_or("");
        let Some((_, data)) = state.files.iter().find(|(_, d)| sha256_hex(d) == sha) else {
            return respond(&mut s, 404, &[], b"");
        };
        let mut data = data.clone();
        let mut faults = state.faults.lock().unwrap();
        if let Some(i) = faults.corrupt_at {
            data[i] ^= 0x40;
        }
        let from: usize = seen
            .range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        if from >= data.len() && from > 0 {
            return respond(&mut s, 416, &[], b"");
        }
        let body = &data[from..];
        let (status, content_range) = if seen.range.is_some() {
            (
                206,
                format!(
                    "Content-Range: bytes {from}-{}/{}",
                    data.len() - 1,
                    data.len()
                ),
            )
        } else {
            (200, "Accept-Ranges: bytes".to_string())
        };
        if name == "cdn" {
            if let Some(n) = faults.drop_after.take() {
                drop(faults);
                let head = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n{content_range}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                s.write_all(head.as_bytes())?;
                s.write_all(&body[..n])?;
                s.flush()?;
                return s.shutdown(Shutdown::Both);
            }
        }
        drop(faults);
        return respond(
            &mut s,
            status,
            &[&content_range, "Accept-Ranges: bytes"],
            body,
        );
    }
    respond(&mut s, 404, &[], b"not here")
}

fn respond(s: &mut TcpStream, status: u16, headers: &[&str], body: &[u8]) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    s.flush()
}

/// A temporary root with the cache, a home, an XDG cache and a working folder: everything but
/// the cache must stay empty.
struct Sandbox {
    root: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        let root = tempfile::tempdir().unwrap();
        for d in ["cache", "home", "xdg", "work"] {
            std::fs::create_dir(root.path().join(d)).unwrap();
        }
        Sandbox { root }
    }

    fn cache(&self) -> PathBuf {
        self.root.path().join("cache")
    }

    fn deltaq(&self, hub: &str, args: &[&str]) -> (bool, String, String) {
        let p = self.root.path();
        let out = Command::new(env!("CARGO_BIN_EXE_deltaq"))
            .args(args)
            .current_dir(p.join("work"))
            .env("DELTAQ_CACHE", self.cache())
            .env("HOME", p.join("home"))
            .env("XDG_CACHE_HOME", p.join("xdg"))
            .env("HF_ENDPOINT", hub)
            .env("NO_PROXY", "127.0.0.1")
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("all_proxy")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    }

    /// Every file under the root, relative to it.
    fn files(&self) -> BTreeSet<String> {
        fn walk(d: &Path, root: &Path, out: &mut BTreeSet<String>) {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, root, out);
                } else {
                    out.insert(
                        p.strip_prefix(root)
                            .unwrap()
                            .to_string_lossy()
                            .replace('\\', "/"),
                    );
                }
            }
        }
        let mut out = BTreeSet::new();
        walk(self.root.path(), self.root.path(), &mut out);
        out
    }

    fn assert_only_in_cache(&self) {
        for f in self.files() {
            assert!(f.starts_with("cache/"), "written outside the cache: {f}");
        }
    }

    fn cached(&self, path: &str) -> PathBuf {
        self.cache().join("hf").join(REPO).join(path)
    }
}

fn lib_hub(server: &FakeHub, sandbox: &Sandbox) -> Hub {
    let mut hub = Hub::new(&server.url, None, Cache::new(sandbox.cache()));
    hub.progress = false;
    hub.retry_delay = Duration::ZERO;
    hub
}

#[test]
fn pull_brings_the_model_and_mmproj_byte_identical_and_lists_them() {
    let server = FakeHub::start();
    server.faults().token = Some("hf_secret".into());
    let sb = Sandbox::new();
    let p = sb.root.path();

    // without the token the hub says 401, and the message says what to do
    let (ok, _, err) = sb.deltaq(&server.url, &["pull", &format!("{REPO}:q8_0")]);
    assert!(!ok);
    assert!(err.contains("401") && err.contains("HF_TOKEN"), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_deltaq"))
        .args(["pull", &format!("{REPO}:q8_0")])
        .current_dir(p.join("work"))
        .env("DELTAQ_CACHE", sb.cache())
        .env("HOME", p.join("home"))
        .env("XDG_CACHE_HOME", p.join("xdg"))
        .env("HF_ENDPOINT", &server.url)
        .env("HF_TOKEN", "hf_secret")
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "{stderr}");
    let paths: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        paths,
        [
            sb.cached(MODEL_FILE).to_str().unwrap(),
            sb.cached(MMPROJ_FILE).to_str().unwrap()
        ]
    );
    assert!(std::fs::read(paths[0]).unwrap() == demo_model());
    assert!(std::fs::read(paths[1]).unwrap() == server.file(MMPROJ_FILE));

    // the token went to the hub, never to the CDN; the listing was read in both its pages
    let seen = server.seen();
    assert!(
        seen.iter().any(|s| s.path.ends_with("&cursor=2")),
        "{seen:?}"
    );
    for s in &seen {
        let authorized = s.auth.as_deref() == Some("Bearer hf_secret");
        assert!(
            if s.server == "cdn" {
                s.auth.is_none()
            } else {
                authorized || !s.path.contains("resolve")
            },
            "{s:?}"
        );
    }
    assert_eq!(server.cdn_requests().len(), 1, "{seen:?}");

    // a second pull finds both in the cache and downloads nothing
    let before = server.seen().len();
    let (ok, out2, err) = sb.deltaq(&server.url, &["pull", &format!("{REPO}:Q8_0"), "--offline"]);
    assert!(ok, "{err}");
    assert_eq!(out2, stdout);
    assert_eq!(server.seen().len(), before);

    let (ok, list, err) = sb.deltaq(&server.url, &["list"]);
    assert!(ok, "{err}");
    let rows: Vec<&str> = list.lines().filter(|l| l.contains(REPO)).collect();
    assert_eq!(rows.len(), 2, "{list}");
    assert!(
        rows[0].contains(MMPROJ_FILE) && rows[1].contains(MODEL_FILE),
        "{list}"
    );
    assert!(
        rows[1].contains("Q8_0") && rows[1].contains("9.2 MiB"),
        "{list}"
    );

    let files = sb.files();
    assert_eq!(
        files,
        [MMPROJ_FILE, MODEL_FILE]
            .iter()
            .flat_map(|f| [
                format!("cache/hf/{REPO}/{f}"),
                format!("cache/hf/{REPO}/{f}.sha256")
            ])
            .collect::<BTreeSet<_>>()
    );
}

#[test]
fn a_dropped_connection_resumes_with_a_range_request() {
    let server = FakeHub::start();
    let sb = Sandbox::new();
    let cut = 3_000_001;
    server.faults().drop_after = Some(cut);
    let (ok, out, err) = sb.deltaq(&server.url, &["pull", REPO, "--no-mmproj"]);
    assert!(ok, "{err}");
    assert!(err.contains("retry 1 of 3"), "{err}");
    assert_eq!(out.trim(), sb.cached(MODEL_FILE).to_str().unwrap());
    assert!(std::fs::read(sb.cached(MODEL_FILE)).unwrap() == demo_model());
    let cdn = server.cdn_requests();
    assert_eq!(cdn.len(), 2, "{cdn:?}");
    assert_eq!(cdn[0].range, None);
    assert_eq!(cdn[1].range.as_deref(), Some(&*format!("bytes={cut}-")));
    sb.assert_only_in_cache();
}

#[test]
fn a_killed_download_resumes_on_the_next_pull_and_a_stale_part_starts_over() {
    let server = FakeHub::start();
    let sb = Sandbox::new();
    let r = ModelRef::parse(&format!("{REPO}:Q8_0")).unwrap();
    let mut hub = lib_hub(&server, &sb);
    hub.retries = 0;
    let cut = 4_321_000;
    server.faults().drop_after = Some(cut);
    match hub.pull(&r, false) {
        Err(PullError::Interrupted { done, .. }) => assert_eq!(done, cut as u64),
        other => panic!("{other:?}"),
    }
    let part = sb.cached(&format!("{MODEL_FILE}.part"));
    assert_eq!(std::fs::metadata(&part).unwrap().len(), cut as u64);
    assert!(!sb.cached(MODEL_FILE).exists());

    let pulled = hub.pull(&r, false).unwrap();
    assert_eq!(pulled.model, [sb.cached(MODEL_FILE)]);
    assert!(std::fs::read(&pulled.model[0]).unwrap() == demo_model());
    assert!(!part.exists());
    let cdn = server.cdn_requests();
    assert_eq!(cdn[1].range.as_deref(), Some(&*format!("bytes={cut}-")));

    // a part left from other bytes: resumed, fails the checksum, is deleted and fetched whole
    let f16 = "tiny-kjv-mtp-F16.gguf";
    std::fs::write(sb.cached(&format!("{f16}.part")), [1u8; 1000]).unwrap();
    let pulled = hub
        .pull(&ModelRef::parse(&format!("{REPO}:F16")).unwrap(), true)
        .unwrap();
    assert!(std::fs::read(&pulled.model[0]).unwrap() == server.file(f16));
    // the mmproj nearest in bits to F16
    assert_eq!(pulled.mmproj, Some(sb.cached(MMPROJ_FILE)));
    let cdn: Vec<Seen> = server
        .seen()
        .into_iter()
        .filter(|s| s.path.starts_with("/blob/"))
        .skip(2)
        .collect();
    assert_eq!(cdn[0].range.as_deref(), Some("bytes=1000-"), "{cdn:?}");
    assert_eq!(cdn[1].range, None, "{cdn:?}");
    sb.assert_only_in_cache();
}

#[test]
fn a_corrupted_byte_fails_the_checksum_and_nothing_is_kept() {
    let server = FakeHub::start();
    let sb = Sandbox::new();
    server.faults().corrupt_at = Some(5_000_000);
    let (ok, out, err) = sb.deltaq(&server.url, &["pull", &format!("{REPO}:Q8_0")]);
    assert!(!ok);
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("checksum mismatch")
            && err.contains(MODEL_FILE)
            && err.contains(&sha256_hex(&demo_model())),
        "{err}"
    );
    // no model file, whole or partial; the mmproj after it was never reached
    let files = sb.files();
    assert!(
        files.iter().all(|f| !f.contains("tiny-kjv-mtp")),
        "{files:?}"
    );
    sb.assert_only_in_cache();

    let (ok, _, err) = sb.deltaq(&server.url, &["pull", &format!("{REPO}:Q8_0"), "--offline"]);
    assert!(!ok && err.contains("not in the cache"), "{err}");
}

#[test]
fn a_model_larger_than_the_free_space_fails_before_anything_is_written() {
    let server = FakeHub::start();
    let sb = Sandbox::new();
    server.faults().listed_size = Some(1 << 60);
    let started = Instant::now();
    let (ok, out, err) = sb.deltaq(&server.url, &["pull", &format!("{REPO}:Q8_0")]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("not enough disk space")
            && err.contains("1048576.0 TiB to download")
            && err.contains("DELTAQ_CACHE"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(server.cdn_requests().is_empty());
    assert_eq!(sb.files(), BTreeSet::new());
    assert_eq!(std::fs::read_dir(sb.cache()).unwrap().count(), 0);
}

/// A disk that fills up during the download: the part is the kernel's always-full device, so every
/// write fails with ENOSPC as on a full disk. The error says so, and nothing gets the model's name.
#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_during_the_download_stops_with_a_clear_message() {
    let server = FakeHub::start();
    let sb = Sandbox::new();
    let part = sb.cached(&format!("{MODEL_FILE}.part"));
    std::fs::create_dir_all(part.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/dev/full", &part).unwrap();
    let (ok, out, err) = sb.deltaq(&server.url, &["pull", REPO, "--no-mmproj"]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("disk full writing") && err.contains(MODEL_FILE) && err.contains("resume"),
        "{err}"
    );
    assert!(!err.contains("retry"), "a full disk is not retried: {err}");
    assert!(!sb.cached(MODEL_FILE).exists());
    assert!(std::fs::symlink_metadata(&part)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn offline_uses_the_cache_and_says_clearly_when_it_is_not_there() {
    let sb = Sandbox::new();
    let server = FakeHub::start();
    let url = server.url.clone();
    let (ok, _, err) = sb.deltaq(&url, &["pull", REPO, "--offline"]);
    assert!(!ok);
    assert!(
        err.contains(&format!("{REPO} is not in the cache")) && err.contains("without --offline"),
        "{err}"
    );
    assert!(server.seen().is_empty());
    assert!(sb.files().is_empty(), "{:?}", sb.files());

    let (ok, _, err) = sb.deltaq(&url, &["pull", &format!("{REPO}:Q8_0"), "--no-mmproj"]);
    assert!(ok, "{err}");
    drop(server); // the hub goes away: from now on nothing listens there

    let (ok, out, err) = sb.deltaq(&url, &["pull", REPO, "--offline", "--no-mmproj"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), sb.cached(MODEL_FILE).to_str().unwrap());
    // a quant that was never pulled: named, with what the cache has
    let (ok, _, err) = sb.deltaq(&url, &["pull", &format!("{REPO}:F16"), "--offline"]);
    assert!(!ok);
    assert!(
        err.contains(&format!("{REPO}:F16 is not in the cache")) && err.contains(MODEL_FILE),
        "{err}"
    );
    // without --offline, an unreachable hub falls back to the cache with a note
    let (ok, out, err) = sb.deltaq(&url, &["pull", REPO, "--no-mmproj"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("cannot reach") && err.contains("using the cached copy"),
        "{err}"
    );
    assert_eq!(out.trim(), sb.cached(MODEL_FILE).to_str().unwrap());
    // ... and fails clearly when the cache does not have it
    let (ok, _, err) = sb.deltaq(&url, &["pull", "other/repo"]);
    assert!(
        !ok && err.contains("cannot reach") && err.contains("--offline"),
        "{err}"
    );
    // -hf on run works offline from the cache
    let (ok, out, err) = sb.deltaq(
        &url,
        &[
            "run",
            "-hf",
            &format!("{REPO}:Q8_0"),
            "--offline",
            "--raw",
            "-p",
            "And God",
            "-n",
            "8",
            "--temp",
            "0",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.starts_with("And God"), "{out}");
    sb.assert_only_in_cache();
}

#[test]
fn wrong_names_get_errors_that_say_what_exists() {
    let server = FakeHub::start();
    let sb = Sandbox::new();
    let (ok, _, err) = sb.deltaq(&server.url, &["pull", &format!("{REPO}:Q5_K_M")]);
    assert!(!ok);
    assert!(
        err.contains(&format!("{REPO} has no Q5_K_M model file")) && err.contains("F16, Q8_0"),
        "{err}"
    );
    let (ok, _, err) = sb.deltaq(&server.url, &["pull", "nobody/nothing"]);
    assert!(
        !ok && err.contains("nobody/nothing not found (404"),
        "{err}"
    );
    let (ok, _, err) = sb.deltaq(&server.url, &["pull", &format!("{REPO}/sub/none.gguf")]);
    assert!(
        !ok && err.contains("has no file sub/none.gguf") && err.contains(MODEL_FILE),
        "{err}"
    );
    let (ok, _, err) = sb.deltaq(&server.url, &["pull", "../../etc:Q4_K_M"]);
    assert!(
        !ok && err.contains("not a Hugging Face repository name"),
        "{err}"
    );
    server.faults().status = Some(403);
    let (ok, _, err) = sb.deltaq(&server.url, &["pull", REPO]);
    assert!(
        !ok && err.contains("403") && err.contains("gated") && err.contains("HF_TOKEN"),
        "{err}"
    );
    let (ok, _, err) = sb.deltaq(&server.url, &["run", "-m", "x.gguf", "-hf", REPO]);
    assert!(!ok && err.contains("not both"), "{err}");
    assert!(sb.files().is_empty(), "{:?}", sb.files());
}

#[test]
fn run_with_hf_generates_text_from_the_downloaded_model() {
    let server = FakeHub::start();
    let sb = Sandbox::new();
    let (ok, out, err) = sb.deltaq(
        &server.url,
        &[
            "run",
            "-hf",
            &format!("{REPO}:Q8_0"),
            "--raw",
            "-p",
            "And God said",
            "-n",
            "40",
            "--temp",
            "0",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.starts_with("And God said"), "{out}");
    assert!(out.split_whitespace().count() > 15, "{out}");
    // run fetches the mmproj alongside and names it
    assert!(err.contains("mmproj") && err.contains(MMPROJ_FILE), "{err}");
    assert!(std::fs::read(sb.cached(MODEL_FILE)).unwrap() == demo_model());
    sb.assert_only_in_cache();
}
