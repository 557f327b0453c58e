//! The download cache: `ROOT/hf/OWNER/NAME/PATH` for each complete, verified file, with its SHA-256
//! beside it in `PATH.sha256`; downloads grow in `PATH.part` until verified and renamed. Only
//! `.gguf` files are ever pulled, so no repository file can collide with these names.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::reference::{is_safe_repo_path, is_valid_repo_id};
use super::select::RepoFile;

/// Subfolder of the cache for files from Hugging Face repositories.
const HF_DIR: &str = "hf";

/// A cached file, as `deltaq list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedFile {
    pub repo: String,
    pub file: RepoFile,
    pub local: PathBuf,
}

/// The cache folder.
#[derive(Clone, Debug)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    pub fn new(root: impl Into<PathBuf>) -> Cache {
        Cache { root: root.into() }
    }

    /// `DELTAQ_CACHE`, else `deltaq` in the user's cache folder (`XDG_CACHE_HOME`, `~/.cache`, or
    /// `%LOCALAPPDATA%` on Windows).
    pub fn from_env() -> Option<Cache> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        if let Some(dir) = var("DELTAQ_CACHE") {
            return Some(Cache::new(dir));
        }
        let base = if cfg!(windows) {
            var("LOCALAPPDATA")
        } else {
            var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))
        }?;
        Some(Cache::new(base.join("deltaq")))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder of a repository's files (`repo` must be a valid repository id).
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        debug_assert!(is_valid_repo_id(repo));
        let (owner, name) = repo.split_once('/').unwrap_or((repo, ""));
        self.root.join(HF_DIR).join(owner).join(name)
    }

    /// Where a repository file is kept (`path` must be a safe repository path).
    pub fn path_of(&self, repo: &str, path: &str) -> PathBuf {
        debug_assert!(is_safe_repo_path(path));
        path.split('/')
            .fold(self.repo_dir(repo), |dir, part| dir.join(part))
    }

    /// The complete `.gguf` files cached for `repo`, sorted by path.
    pub fn files(&self, repo: &str) -> io::Result<Vec<RepoFile>> {
        let dir = self.repo_dir(repo);
        let mut out = Vec::new();
        if dir.is_dir() {
            walk(&dir, "", &mut out)?;
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Every cached model file, by repository and path.
    pub fn list(&self) -> io::Result<Vec<CachedFile>> {
        let mut out = Vec::new();
        for owner in sorted_dirs(&self.root.join(HF_DIR))? {
            for name in sorted_dirs(&owner)? {
                let (Some(o), Some(n)) = (file_name(&owner), file_name(&name)) else {
                    continue;
                };
                let repo = format!("{o}/{n}");
                if !is_valid_repo_id(&repo) {
                    continue;
                }
                for file in self.files(&repo)? {
                    let local = self.path_of(&repo, &file.path);
                    out.push(CachedFile {
                        repo: repo.clone(),
                        file,
                        local,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// The SHA-256 recorded beside a verified file.
pub(crate) fn sidecar(path: &Path) -> PathBuf {
    with_suffix(path, ".sha256")
}

/// The partial download of a file.
pub(crate) fn part(path: &Path) -> PathBuf {
    with_suffix(path, ".part")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The recorded SHA-256 of a cached file, if there is a well-formed one.
pub(crate) fn read_sidecar(path: &Path) -> Option<String> {
    let s = fs::read_to_string(sidecar(path)).ok()?;
    let s = s.trim().to_ascii_lowercase();
    super::is_sha256(&s).then_some(s)
}

fn file_name(p: &Path) -> Option<&str> {
    p.file_name()?.to_str()
}

fn sorted_dirs(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut dirs = Vec::new();
    for e in entries {
        let e = e?;
        if e.file_type()?.is_dir() {
            dirs.push(e.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

fn walk(dir: &Path, rel: &str, out: &mut Vec<RepoFile>) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        // symlinks are not followed: the cache holds none of its own
        let kind = e.file_type()?;
        if kind.is_dir() {
            walk(&e.path(), &path, out)?;
        } else if kind.is_file()
            && name.to_ascii_lowercase().ends_with(".gguf")
            && is_safe_repo_path(&path)
        {
            out.push(RepoFile {
                size: e.metadata()?.len(),
                sha256: read_sidecar(&e.path()),
                path,
            });
        }
    }
    Ok(())
}
