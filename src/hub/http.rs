//! The Hugging Face endpoints `deltaq pull` uses: the recursive tree listing
//! (`/api/models/{repo}/tree/main?recursive=true`, paged by `Link: <...>; rel="next"`) and
//! `/{repo}/resolve/main/{path}`, which redirects to a CDN and names the LFS SHA-256 in
//! `X-Linked-Etag`. Redirects are followed here rather than by the client so that the token goes
//! only to the hub's own host (a CDN's signed URL refuses a second credential) and the resolve
//! response's headers stay visible.

use std::time::Duration;

use serde::Deserialize;

use super::reference::is_safe_repo_path;
use super::select::RepoFile;
use super::{is_sha256, PullError};

/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 10;
/// Largest listing page read (the hub sends at most a thousand entries a page).
const MAX_LISTING_BYTES: u64 = 64 << 20;
/// Listing pages read before giving up (a thousand entries each).
const MAX_LISTING_PAGES: usize = 100;

/// An entry of the tree listing.
#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    lfs: Option<LfsInfo>,
}

/// The LFS pointer of a large file: `oid` is the content's SHA-256.
#[derive(Deserialize)]
struct LfsInfo {
    oid: String,
    size: u64,
}

/// Why a request failed: worth another try (the network, a 5xx) or not.
pub(crate) enum Failure {
    Retry(PullError),
    Fatal(PullError),
}

impl Failure {
    pub(crate) fn into_error(self) -> PullError {
        match self {
            Failure::Retry(e) | Failure::Fatal(e) => e,
        }
    }
}

/// The client side of the hub: endpoint, token and a blocking HTTPS agent.
pub(crate) struct HubHttp {
    pub endpoint: String,
    pub token: Option<String>,
    agent: ureq::Agent,
}

/// A response after redirects, with the resolve endpoint's `X-Linked-Etag` if it sent one.
pub(crate) struct Resolved {
    pub response: ureq::http::Response<ureq::Body>,
    pub linked_sha256: Option<String>,
}

impl HubHttp {
    pub fn new(endpoint: &str, token: Option<String>) -> HubHttp {
        let agent = ureq::Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(20)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // a stalled transfer fails (and resumes) instead of hanging
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(concat!("deltaq/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        HubHttp {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            agent,
        }
    }

    /// The URL of a file of `repo` at the main revision.
    pub fn resolve_url(&self, repo: &str, path: &str) -> String {
        let path: Vec<String> = path.split('/').map(percent_encode).collect();
        format!("{}/{repo}/resolve/main/{}", self.endpoint, path.join("/"))
    }

    /// Every file of `repo` at the main revision.
    pub fn list_files(&self, repo: &str) -> Result<Vec<RepoFile>, Failure> {
        let mut url = format!(
            "{}/api/models/{repo}/tree/main?recursive=true",
            self.endpoint
        );
        let mut files = Vec::new();
        for _ in 0..MAX_LISTING_PAGES {
            let Resolved { response, .. } = self.get(&url, None)?;
            check_status(response.status().as_u16(), repo, &url, None)?;
            let next = next_page(&response).map(|n| join_url(&url, &n));
            let body = response
                .into_body()
                .with_config()
                .limit(MAX_LISTING_BYTES)
                .read_to_vec()
                .map_err(|e| Failure::Retry(network(&url, &e)))?;
            let entries: Vec<TreeEntry> = serde_json::from_slice(&body).map_err(|e| {
                Failure::Fatal(PullError::Protocol {
                    url: url.clone(),
                    detail: format!("the file listing is not what the hub sends: {e}"),
                })
            })?;
            files.extend(entries.into_iter().filter_map(repo_file));
            match next {
                Some(n) => url = n,
                None => {
                    files.sort_by(|a, b| a.path.cmp(&b.path));
                    return Ok(files);
                }
            }
        }
        Err(Failure::Fatal(PullError::Protocol {
            url,
            detail: format!("the listing has more than {MAX_LISTING_PAGES} pages"),
        }))
    }

    /// GET `url`, from byte `from` on if given, following redirects; the token goes only to the
    /// endpoint's host.
    pub fn get(&self, url: &str, from: Option<u64>) -> Result<Resolved, Failure> {
        let mut url = url.to_string();
        let mut linked_sha256 = None;
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self.agent.get(&url);
            if let Some(t) = self
                .token
                .as_ref()
                .filter(|_| same_origin(&url, &self.endpoint))
            {
                req = req.header("Authorization", format!("Bearer {t}"));
            }
            if let Some(from) = from {
                req = req.header("Range", format!("bytes={from}-"));
            }
            let response = req.call().map_err(|e| Failure::Retry(network(&url, &e)))?;
            if linked_sha256.is_none() {
                linked_sha256 = header(&response, "x-linked-etag")
                    .map(|e| {
                        e.trim_start_matches("W/")
                            .trim_matches('"')
                            .to_ascii_lowercase()
                    })
                    .filter(|e| is_sha256(e));
            }
            if !response.status().is_redirection() {
                return Ok(Resolved {
                    response,
                    linked_sha256,
                });
            }
            let Some(location) = header(&response, "location") else {
                return Err(Failure::Fatal(PullError::Protocol {
                    url,
                    detail: format!("HTTP {} without a Location", response.status()),
                }));
            };
            url = join_url(&url, &location);
        }
        Err(Failure::Fatal(PullError::Protocol {
            url,
            detail: format!("more than {MAX_REDIRECTS} redirects"),
        }))
    }
}

/// The error for an unsuccessful status: 401, 403 and 404 name what to do; 429 and 5xx are worth
/// another try. `file` is the repository file asked for (None: the listing).
pub(crate) fn check_status(
    status: u16,
    repo: &str,
    url: &str,
    file: Option<&str>,
) -> Result<(), Failure> {
    let repo = repo.to_string();
    match status {
        200..=299 => Ok(()),
        401 => Err(Failure::Fatal(PullError::Unauthorized { repo })),
        403 => Err(Failure::Fatal(PullError::Forbidden { repo })),
        404 => Err(Failure::Fatal(match file {
            Some(f) => PullError::RemoteFileNotFound {
                repo,
                file: f.to_string(),
            },
            None => PullError::RepoNotFound {
                repo,
                url: url.to_string(),
            },
        })),
        429 | 500..=599 => Err(Failure::Retry(PullError::Http {
            url: url.to_string(),
            status,
        })),
        _ => Err(Failure::Fatal(PullError::Http {
            url: url.to_string(),
            status,
        })),
    }
}

pub(crate) fn header(r: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A listing entry as a file we may fetch: files only, at paths that stay inside the cache.
fn repo_file(e: TreeEntry) -> Option<RepoFile> {
    if e.kind != "file" || !is_safe_repo_path(&e.path) {
        return None;
    }
    let (size, sha256) = match e.lfs {
        Some(l) => (
            l.size,
            Some(l.oid.to_ascii_lowercase()).filter(|s| is_sha256(s)),
        ),
        // a plain git file's oid is a SHA-1 of the blob, not of the content
        None => (e.size, None),
    };
    Some(RepoFile {
        path: e.path,
        size,
        sha256,
    })
}

/// The `rel="next"` target of a `Link` header.
fn next_page(r: &ureq::http::Response<ureq::Body>) -> Option<String> {
    let link = header(r, "link")?;
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        let is_next = params.split(';').any(|p| {
            p.trim()
                .replace(' ', "")
                .eq_ignore_ascii_case("rel=\"next\"")
        });
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        is_next.then(|| target.to_string())
    })
}

fn network(url: &str, e: &ureq::Error) -> PullError {
    PullError::Network {
        host: origin(url).to_string(),
        detail: e.to_string(),
    }
}

/// `scheme://host[:port]` of a URL.
pub(crate) fn origin(url: &str) -> &str {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    &url[..end]
}

fn same_origin(a: &str, b: &str) -> bool {
    origin(a).eq_ignore_ascii_case(origin(b))
}

/// `location` (absolute, scheme-relative, absolute-path or relative) against `base`.
fn join_url(base: &str, location: &str) -> String {
    if location.contains("://") {
        location.to_string()
    } else if location.starts_with("//") {
        let scheme = base.split("://").next().unwrap_or("https");
        format!("{scheme}:{location}")
    } else if location.starts_with('/') {
        format!("{}{location}", origin(base))
    } else {
        let path_end = base.find(['?', '#']).unwrap_or(base.len());
        let dir_end = base[..path_end]
            .rfind('/')
            .filter(|&i| i >= origin(base).len())
            .map_or(path_end, |i| i + 1);
        let dir = &base[..dir_end];
        let sep = if dir.ends_with('/') { "" } else { "/" };
        format!("{dir}{sep}{location}")
    }
}

/// A path segment of a URL: unreserved characters stay, every other byte is `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_join_and_compare_as_browsers_do() {
        let base = "https://huggingface.co/a/b/resolve/main/x.gguf?download=true";
        assert_eq!(origin(base), "https://huggingface.co");
        assert_eq!(
            join_url(base, "https://cdn.example/blob?sig=1"),
            "https://cdn.example/blob?sig=1"
        );
        assert_eq!(
            join_url(base, "/api/resolve-cache/x"),
            "https://huggingface.co/api/resolve-cache/x"
        );
        assert_eq!(join_url(base, "//cdn.example/y"), "https://cdn.example/y");
        assert_eq!(
            join_url(base, "y.gguf"),
            "https://huggingface.co/a/b/resolve/main/y.gguf"
        );
        assert!(same_origin(base, "https://HuggingFace.co"));
        assert!(!same_origin(base, "https://huggingface.co.evil"));
        assert!(!same_origin(
            "http://127.0.0.1:80/x",
            "http://127.0.0.1:8080"
        ));
        assert_eq!(percent_encode("a b+c.gguf"), "a%20b%2Bc.gguf");
    }
}
