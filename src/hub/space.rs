//! Free space on the cache's disk, checked before a download so that a file that cannot fit fails
//! at once with the sizes, instead of filling the disk and failing part way.

use std::path::Path;

/// Bytes an unprivileged process may still write on the filesystem holding `path` (or its nearest
/// existing ancestor, as the cache folder may not exist yet); `None` when that cannot be told.
pub(crate) fn available_bytes(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    statvfs_available(existing)
}

#[cfg(unix)]
fn statvfs_available(path: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

#[cfg(not(unix))]
fn statvfs_available(_path: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_folder_is_measured_at_its_nearest_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let here = available_bytes(dir.path());
        let below = available_bytes(&dir.path().join("not/yet/there"));
        assert!(here.is_some_and(|b| b > 0), "{here:?}");
        // the same filesystem: within what other writers change in between
        let (a, b) = (here.unwrap(), below.unwrap());
        assert!(a.abs_diff(b) < 1 << 30, "{a} vs {b}");
    }
}
