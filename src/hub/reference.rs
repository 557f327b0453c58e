//! `REPO[:QUANT]` and `REPO/path/in/repo.gguf`: what `deltaq pull` and `-hf` name, in llama.cpp's
//! syntax, validated so that nothing built from it can leave the cache folder.

use std::fmt;

/// A model on the hub: a repository and either a quantization to pick or one file path in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelRef {
    /// `owner/name`
    pub repo: String,
    /// The quantization asked for (`Q4_K_M`), matched case-insensitively against file names
    pub quant: Option<String>,
    /// One file of the repository, by its full path
    pub file: Option<String>,
}

impl ModelRef {
    /// Parses `owner/name`, `owner/name:QUANT`, `owner/name/dir/file.gguf` or `owner/name:file.gguf`.
    pub fn parse(s: &str) -> Result<ModelRef, String> {
        let (left, tag) = match s.split_once(':') {
            Some((l, t)) => (l, Some(t)),
            None => (s, None),
        };
        let mut parts = left.splitn(3, '/');
        let (owner, name) = match (parts.next(), parts.next()) {
            (Some(o), Some(n)) => (o, n),
            _ => {
                return Err(format!(
                    "'{s}' is not a model name: expected OWNER/NAME[:QUANT]"
                ))
            }
        };
        let repo = format!("{owner}/{name}");
        if !is_valid_repo_id(&repo) {
            return Err(format!(
                "'{repo}' is not a Hugging Face repository name (OWNER/NAME of letters, digits, '_', \
                 '-' and '.')"
            ));
        }
        let mut file = parts.next().map(str::to_string);
        let mut quant = None;
        match tag {
            Some(t) if t.to_ascii_lowercase().ends_with(".gguf") && file.is_none() => {
                file = Some(t.to_string())
            }
            Some(t) if file.is_some() => {
                return Err(format!(
                    "'{s}': give a quantization or a file path, not both ({t})"
                ))
            }
            Some(t) => {
                if t.is_empty() || !t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!(
                        "'{t}' is not a quantization name (letters, digits and '_', like Q4_K_M)"
                    ));
                }
                quant = Some(t.to_string());
            }
            None => {}
        }
        if let Some(f) = &file {
            if !is_safe_repo_path(f) || !f.to_ascii_lowercase().ends_with(".gguf") {
                return Err(format!("'{f}' is not a .gguf file path inside {repo}"));
            }
        }
        Ok(ModelRef { repo, quant, file })
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, &self.quant) {
            (Some(file), _) => write!(f, "{}/{file}", self.repo),
            (None, Some(q)) => write!(f, "{}:{q}", self.repo),
            (None, None) => write!(f, "{}", self.repo),
        }
    }
}

/// Hugging Face's rule for repository ids: `owner/name`, each of `[A-Za-z0-9_]` with single `-` or
/// `.` between them (so never `..` or a leading dot), at most 96 characters each.
pub fn is_valid_repo_id(repo: &str) -> bool {
    let Some((owner, name)) = repo.split_once('/') else {
        return false;
    };
    [owner, name].iter().all(|part| {
        let base = |c: char| c.is_ascii_alphanumeric() || c == '_';
        !part.is_empty()
            && part.len() <= 96
            && part.starts_with(base)
            && part.ends_with(base)
            && part.chars().all(|c| base(c) || c == '-' || c == '.')
            && !part.contains("--")
            && !part.contains("..")
    })
}

/// A relative path inside a repository that stays inside the folder it is joined to: `/`-separated,
/// no empty, `.` or `..` component, no backslash, colon or control character.
pub fn is_safe_repo_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 1024
        && path.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && !c
                    .chars()
                    .any(|ch| ch == '\\' || ch == ':' || ch.is_control())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_llama_cpp_syntax() {
        let r = ModelRef::parse("unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M").unwrap();
        assert_eq!(r.repo, "unsloth/Qwen3.5-0.8B-GGUF");
        assert_eq!(r.quant.as_deref(), Some("Q4_K_M"));
        assert_eq!(r.file, None);
        let r = ModelRef::parse("unsloth/Qwen3.5-0.8B-GGUF").unwrap();
        assert_eq!((r.quant, r.file), (None, None));
        let r = ModelRef::parse("a/b/sub/x-Q8_0.gguf").unwrap();
        assert_eq!(r.repo, "a/b");
        assert_eq!(r.file.as_deref(), Some("sub/x-Q8_0.gguf"));
        let r = ModelRef::parse("a/b:x-Q8_0.gguf").unwrap();
        assert_eq!(r.file.as_deref(), Some("x-Q8_0.gguf"));
        assert_eq!(r.to_string(), "a/b/x-Q8_0.gguf");
    }

    #[test]
    fn rejects_names_that_could_escape_the_cache() {
        for bad in [
            "model",
            "a/../b",
            "../a/b",
            "a/b:",
            "a/b:Q4/../x",
            "a/b/../../x.gguf",
            "a/b//x.gguf",
            "a/b/x.bin",
            "a/b/sub/x.gguf:Q4_K_M",
            ".a/b",
            "a/b\\c",
            "/a/b",
        ] {
            assert!(ModelRef::parse(bad).is_err(), "{bad}");
        }
        assert!(!is_safe_repo_path("a/../b"));
        assert!(!is_safe_repo_path("C:x"));
        assert!(is_safe_repo_path("dir/file-Q4_K_M.gguf"));
    }
}
