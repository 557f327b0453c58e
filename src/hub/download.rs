//! One file into the cache: bytes go to `FILE.part` (resumed with an HTTP Range when one is there),
//! are hashed on the way, and the part becomes `FILE` by a rename only once its size and SHA-256
//! match the hub's; a mismatching download is deleted.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::cache::{part, read_sidecar, sidecar};
use super::http::{check_status, header, Failure, HubHttp};
use super::select::RepoFile;
use super::PullError;

/// Bytes read and written at a time.
const CHUNK: usize = 1 << 20;

/// How one download attempt went.
pub(crate) enum Outcome {
    Done,
    /// The part was resumed but its bytes do not hash right: it was deleted, start over
    StaleResume,
}

/// Whether `dest` holds `file`: same size, and the SHA-256 recorded when it was verified matches
/// the hub's (a file without a record is hashed once and gets one).
pub(crate) fn is_current(dest: &Path, file: &RepoFile) -> Result<bool, PullError> {
    let Ok(meta) = fs::metadata(dest) else {
        return Ok(false);
    };
    if !meta.is_file() || meta.len() != file.size {
        return Ok(false);
    }
    let Some(expected) = &file.sha256 else {
        return Ok(true);
    };
    if let Some(recorded) = read_sidecar(dest) {
        return Ok(&recorded == expected);
    }
    let mut f = File::open(dest).map_err(|e| io_error(e, "opening", dest))?;
    let actual = hash_prefix(&mut f, file.size).map_err(|e| io_error(e, "reading", dest))?;
    if &actual.finalize_hex() != expected {
        return Ok(false);
    }
    write_sidecar(dest, expected)?;
    Ok(true)
}

/// One attempt at `file` of `repo` into `dest`; `bar` shows progress.
pub(crate) fn download_once(
    http: &HubHttp,
    repo: &str,
    file: &RepoFile,
    dest: &Path,
    bar: &indicatif::ProgressBar,
) -> Result<Outcome, Failure> {
    let fatal = Failure::Fatal;
    let dir = dest.parent().expect("cache paths have a folder");
    fs::create_dir_all(dir).map_err(|e| fatal(io_error(e, "creating", dir)))?;
    let part_path = part(dest);
    let mut out = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&part_path)
        .map_err(|e| fatal(io_error(e, "opening", &part_path)))?;
    // two pulls of the same file would interleave their bytes
    if let Err(e) = out.try_lock() {
        return Err(fatal(match e {
            fs::TryLockError::WouldBlock => PullError::Busy { path: part_path },
            fs::TryLockError::Error(e) => io_error(e, "locking", &part_path),
        }));
    }
    let part_len = out
        .metadata()
        .map_err(|e| fatal(io_error(e, "reading", &part_path)))?
        .len();
    let mut have = part_len;
    if have > file.size {
        have = 0;
    }
    let mut hasher =
        hash_prefix(&mut out, have).map_err(|e| fatal(io_error(e, "reading", &part_path)))?;
    let resumed_from = have;
    let mut linked_sha256 = None;

    if have < file.size {
        let url = http.resolve_url(repo, &file.path);
        let from = (have > 0).then_some(have);
        let r = http.get(&url, from)?;
        linked_sha256 = r.linked_sha256;
        let status = r.response.status().as_u16();
        check_status(status, repo, &url, Some(&file.path))?;
        let continues = status == 206
            && header(&r.response, "content-range")
                .is_some_and(|c| c.starts_with(&format!("bytes {have}-")));
        if !continues {
            // a whole body (or a range we did not ask for): start the part over
            have = 0;
            hasher = Sha256::new();
        }
        // cut only what is to be rewritten: a part that already has the right length stays as it is
        if part_len != have {
            out.set_len(have)
                .map_err(|e| fatal(write_error(e, &part_path, have, file.size)))?;
        }
        out.seek(SeekFrom::Start(have))
            .map_err(|e| fatal(write_error(e, &part_path, have, file.size)))?;
        bar.set_position(have);
        let mut body = r.response.into_body().into_reader();
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(Failure::Retry(PullError::Interrupted {
                        file: file.path.clone(),
                        done: have,
                        size: file.size,
                        detail: e.to_string(),
                    }))
                }
            };
            if have + n as u64 > file.size {
                drop_part(out, &part_path);
                return Err(fatal(PullError::Protocol {
                    url,
                    detail: format!("the server sent more than the {} bytes listed", file.size),
                }));
            }
            out.write_all(&buf[..n])
                .map_err(|e| fatal(write_error(e, &part_path, have, file.size)))?;
            hasher.update(&buf[..n]);
            have += n as u64;
            bar.set_position(have);
        }
        out.sync_all()
            .map_err(|e| fatal(write_error(e, &part_path, have, file.size)))?;
        if have < file.size {
            return Err(Failure::Retry(PullError::Interrupted {
                file: file.path.clone(),
                done: have,
                size: file.size,
                detail: "the connection closed early".into(),
            }));
        }
    }

    let actual = hasher.finalize_hex();
    let expected = match (&file.sha256, &linked_sha256) {
        (Some(listed), Some(linked)) if listed != linked => {
            drop_part(out, &part_path);
            return Err(fatal(PullError::Changed {
                repo: repo.to_string(),
                file: file.path.clone(),
            }));
        }
        (Some(s), _) | (None, Some(s)) => Some(s.clone()),
        (None, None) => None,
    };
    if let Some(expected) = expected {
        if actual != expected {
            drop_part(out, &part_path);
            if resumed_from > 0 {
                return Ok(Outcome::StaleResume);
            }
            return Err(fatal(PullError::Checksum {
                file: file.path.clone(),
                expected,
                actual,
            }));
        }
    }
    drop(out);
    fs::rename(&part_path, dest).map_err(|e| fatal(io_error(e, "renaming", &part_path)))?;
    write_sidecar(dest, &actual).map_err(fatal)?;
    Ok(Outcome::Done)
}

/// Deletes a part that must not be resumed (closing it first, for Windows).
fn drop_part(f: File, path: &Path) {
    drop(f);
    let _ = fs::remove_file(path);
}

/// Records a verified file's SHA-256 beside it, atomically.
fn write_sidecar(dest: &Path, sha256: &str) -> Result<(), PullError> {
    let path = sidecar(dest);
    let dir = dest.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| io_error(e, "creating a temporary file in", dir))?;
    tmp.write_all(format!("{sha256}\n").as_bytes())
        .map_err(|e| io_error(e, "writing", &path))?;
    tmp.persist(&path)
        .map_err(|e| io_error(e.error, "writing", &path))?;
    Ok(())
}

/// SHA-256 state after the first `len` bytes of `f`.
fn hash_prefix(f: &mut File, len: u64) -> io::Result<Sha256> {
    let mut hasher = Sha256::new();
    f.seek(SeekFrom::Start(0))?;
    let copied = io::copy(&mut f.take(len), &mut HashWriter(&mut hasher))?;
    if copied != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file shorter than expected",
        ));
    }
    Ok(hasher)
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.update(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

trait FinalizeHex {
    fn finalize_hex(self) -> String;
}

impl FinalizeHex for Sha256 {
    fn finalize_hex(self) -> String {
        self.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn io_error(e: io::Error, doing: &str, path: &Path) -> PullError {
    PullError::Io {
        context: format!("{doing} {}", path.display()),
        source: e,
    }
}

/// A failed write, as a disk-full error when it is one.
fn write_error(e: io::Error, path: &Path, done: u64, size: u64) -> PullError {
    if e.kind() == io::ErrorKind::StorageFull || e.kind() == io::ErrorKind::QuotaExceeded {
        PullError::DiskFull {
            path: PathBuf::from(path),
            done,
            size,
        }
    } else {
        io_error(e, "writing", path)
    }
}
