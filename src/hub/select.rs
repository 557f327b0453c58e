//! Which files of a repository listing `REPO[:QUANT]` means, as llama.cpp's `-hf` picks them: the
//! quantization is the tag after the last `-` or `.` of a `.gguf` name (split suffix removed), matched
//! case-insensitively; without one, Q4_K_M, else Q8_0, else the first model file; split files
//! (`-00001-of-00003.gguf`) come as all their parts; the mmproj file is the nearest one in the same
//! folder or above, with the quantization closest in bits.

use super::reference::ModelRef;
use super::PullError;

/// One file of a repository, as the listing (or the cache) describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    /// Path inside the repository
    pub path: String,
    /// Size in bytes
    pub size: u64,
    /// Lowercase hex SHA-256 of the content (the LFS object id), when known
    pub sha256: Option<String>,
}

/// The files to fetch for one [`ModelRef`].
#[derive(Clone, Debug)]
pub struct Selection {
    /// The model: one file, or every part of a split file in order
    pub model: Vec<RepoFile>,
    /// The vision projector that goes with it, when the repository has one
    pub mmproj: Option<RepoFile>,
}

/// Quantizations tried, in order, when none is asked for.
const DEFAULT_QUANTS: [&str; 2] = ["Q4_K_M", "Q8_0"];

/// A `.gguf` name taken apart: `dir/Model-Q4_K_M-00001-of-00002.gguf` has prefix
/// `dir/Model-Q4_K_M`, tag `Q4_K_M`, part 1 of 2.
#[derive(Debug, PartialEq, Eq)]
struct GgufName {
    prefix: String,
    tag: String,
    index: u32,
    count: u32,
}

fn gguf_name(path: &str) -> Option<GgufName> {
    let lower = path.to_ascii_lowercase();
    let stem = path.get(..lower.strip_suffix(".gguf")?.len())?;
    let (prefix, index, count) = split_suffix(stem).unwrap_or((stem, 1, 1));
    let run = prefix
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .count();
    let (head, tag) = prefix.split_at(prefix.len() - run);
    let tag = if !tag.is_empty() && (head.ends_with('-') || head.ends_with('.')) {
        tag.to_ascii_uppercase()
    } else {
        String::new()
    };
    Some(GgufName {
        prefix: prefix.to_string(),
        tag,
        index,
        count,
    })
}

/// `stem-00001-of-00003` -> (`stem`, 1, 3).
fn split_suffix(stem: &str) -> Option<(&str, u32, u32)> {
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, index) = rest.rsplit_once('-')?;
    if !digits(index) || !digits(count) || prefix.is_empty() {
        return None;
    }
    let (index, count) = (index.parse().ok()?, count.parse().ok()?);
    (index >= 1 && index <= count).then_some((prefix, index, count))
}

/// The bits of a tag: Q4_K_M -> 4, F16 -> 16, BF16 -> 16; 0 without digits.
fn tag_bits(tag: &str) -> u32 {
    let digits: String = tag
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().unwrap_or(0)
}

/// A model's weights rather than a companion file: a projector or imatrix anywhere in the name, or
/// a separate draft head named `mtp-...`, `eagle3-...` (llama.cpp looks for these anywhere in the
/// name, which would also drop a whole model with its MTP block inside, like `tiny-kjv-mtp-Q8_0`).
fn is_model_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.to_ascii_lowercase().ends_with(".gguf")
        && !["mmproj", "imatrix"].iter().any(|k| name.contains(k))
        && !["mtp-", "eagle3-", "dflash-", "dspark-"]
            .iter()
            .any(|k| name.starts_with(k))
}

/// The first part (or the only file) of a model.
fn is_first_part(path: &str) -> bool {
    gguf_name(path).is_some_and(|n| n.index == 1)
}

/// The quantization of a model file (`Q4_K_M`), if its name has one.
pub fn quant_of(path: &str) -> Option<String> {
    gguf_name(path).map(|n| n.tag).filter(|t| !t.is_empty())
}

/// The quantizations the repository's model files come in, sorted, each once.
pub fn quants(files: &[RepoFile]) -> Vec<String> {
    let mut q: Vec<String> = files
        .iter()
        .filter(|f| is_model_file(&f.path))
        .filter_map(|f| quant_of(&f.path))
        .collect();
    q.sort();
    q.dedup();
    q
}

/// The model file for `quant`: a file whose tag is the quantization, else (as llama.cpp) one whose
/// path contains it followed by `.` or `-`; without a quantization, the defaults, then any model.
fn find_model<'a>(files: &'a [RepoFile], quant: Option<&str>) -> Option<&'a RepoFile> {
    let candidates = || {
        files
            .iter()
            .filter(|f| is_model_file(&f.path) && is_first_part(&f.path))
    };
    let tags: Vec<&str> = quant.map_or(DEFAULT_QUANTS.to_vec(), |q| vec![q]);
    for tag in tags {
        let upper = tag.to_ascii_uppercase();
        if let Some(f) = candidates().find(|f| quant_of(&f.path).as_deref() == Some(&upper)) {
            return Some(f);
        }
        let (dot, dash) = (format!("{upper}."), format!("{upper}-"));
        if let Some(f) = candidates().find(|f| {
            let p = f.path.to_ascii_uppercase();
            p.contains(&dot) || p.contains(&dash)
        }) {
            return Some(f);
        }
    }
    if quant.is_none() {
        return candidates().next();
    }
    None
}

/// Every part of `first`, in order; an error when the listing misses one.
fn split_parts(
    files: &[RepoFile],
    first: &RepoFile,
    repo: &str,
) -> Result<Vec<RepoFile>, PullError> {
    let Some(name) = gguf_name(&first.path).filter(|n| n.count > 1) else {
        return Ok(vec![first.clone()]);
    };
    let mut parts = Vec::with_capacity(name.count as usize);
    for i in 1..=name.count {
        let part = files.iter().find(|f| {
            gguf_name(&f.path)
                .is_some_and(|n| n.prefix == name.prefix && n.count == name.count && n.index == i)
        });
        match part {
            Some(p) => parts.push(p.clone()),
            None => {
                return Err(PullError::MissingPart {
                    repo: repo.to_string(),
                    file: first.path.clone(),
                    part: i,
                    count: name.count,
                })
            }
        }
    }
    Ok(parts)
}

/// The mmproj file for `model`: in the model's folder or one above it (the deepest wins), then the
/// quantization nearest in bits.
fn find_mmproj<'a>(files: &'a [RepoFile], model: &str) -> Option<&'a RepoFile> {
    let model_dirs: Vec<&str> = model.split('/').collect();
    let model_dirs = &model_dirs[..model_dirs.len() - 1];
    let model_bits = gguf_name(model).map_or(0, |n| tag_bits(&n.tag)) as i64;
    files
        .iter()
        .filter(|f| {
            let name = f.path.rsplit('/').next().unwrap_or(&f.path);
            name.contains("mmproj") && name.to_ascii_lowercase().ends_with(".gguf")
        })
        .filter_map(|f| {
            let dirs: Vec<&str> = f.path.split('/').collect();
            let dirs = &dirs[..dirs.len() - 1];
            let inside = dirs.len() <= model_dirs.len() && model_dirs.starts_with(dirs);
            let bits = gguf_name(&f.path).map_or(0, |n| tag_bits(&n.tag)) as i64;
            inside.then_some((f, dirs.len(), (bits - model_bits).abs()))
        })
        // deepest first, then nearest in bits; the first listed among equals
        .min_by_key(|&(_, depth, diff)| (std::cmp::Reverse(depth), diff))
        .map(|(f, _, _)| f)
}

/// What `r` means in `files` (a listing of `r.repo`), or why it means nothing.
pub fn select(files: &[RepoFile], r: &ModelRef, with_mmproj: bool) -> Result<Selection, PullError> {
    let primary = match &r.file {
        Some(path) => files
            .iter()
            .find(|f| f.path.eq_ignore_ascii_case(path))
            .ok_or_else(|| PullError::FileNotFound {
                repo: r.repo.clone(),
                file: path.clone(),
                files: files
                    .iter()
                    .filter(|f| f.path.to_ascii_lowercase().ends_with(".gguf"))
                    .map(|f| f.path.clone())
                    .collect(),
            })?,
        None => find_model(files, r.quant.as_deref()).ok_or_else(|| match &r.quant {
            Some(q) => PullError::QuantNotFound {
                repo: r.repo.clone(),
                quant: q.clone(),
                quants: quants(files),
            },
            None => PullError::NoGguf {
                repo: r.repo.clone(),
            },
        })?,
    };
    let model = split_parts(files, primary, &r.repo)?;
    let mmproj = if with_mmproj {
        find_mmproj(files, &primary.path).cloned()
    } else {
        None
    };
    Ok(Selection { model, mmproj })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(paths: &[&str]) -> Vec<RepoFile> {
        paths
            .iter()
            .map(|p| RepoFile {
                path: p.to_string(),
                size: 1,
                sha256: None,
            })
            .collect()
    }

    fn pick(files: &[RepoFile], r: &str) -> Result<(Vec<String>, Option<String>), PullError> {
        let s = select(files, &ModelRef::parse(r).unwrap(), true)?;
        Ok((
            s.model.into_iter().map(|f| f.path).collect(),
            s.mmproj.map(|f| f.path),
        ))
    }

    #[test]
    fn takes_gguf_names_apart() {
        let n = gguf_name("d/Qwen3.5-0.8B-Q4_K_M-00002-of-00003.gguf").unwrap();
        assert_eq!(
            n,
            GgufName {
                prefix: "d/Qwen3.5-0.8B-Q4_K_M".into(),
                tag: "Q4_K_M".into(),
                index: 2,
                count: 3
            }
        );
        assert_eq!(quant_of("model.q8_0.gguf").as_deref(), Some("Q8_0"));
        assert_eq!(
            quant_of("Qwen3.5-0.8B-UD-Q4_K_XL.gguf").as_deref(),
            Some("Q4_K_XL")
        );
        assert_eq!(quant_of("README.md"), None);
        assert_eq!(quant_of("model.gguf"), None);
        assert_eq!(tag_bits("BF16"), 16);
        assert_eq!(tag_bits("Q4_K_M"), 4);
    }

    #[test]
    fn picks_quant_case_insensitively_with_defaults_and_mmproj() {
        let files = listing(&[
            "README.md",
            "Qwen3.5-0.8B-IQ4_XS.gguf",
            "Qwen3.5-0.8B-Q4_K_M.gguf",
            "Qwen3.5-0.8B-Q8_0.gguf",
            "Qwen3.5-0.8B-BF16.gguf",
            "mmproj-F16.gguf",
            "mmproj-F32.gguf",
            "imatrix_unsloth.gguf",
            "mtp-Q8_0.gguf",
            "tiny-mtp-Q6_K.gguf",
        ]);
        let (m, p) = pick(&files, "a/b:q8_0").unwrap();
        assert_eq!(m, ["Qwen3.5-0.8B-Q8_0.gguf"]);
        assert_eq!(p.as_deref(), Some("mmproj-F16.gguf"));
        let (m, _) = pick(&files, "a/b").unwrap();
        assert_eq!(m, ["Qwen3.5-0.8B-Q4_K_M.gguf"]);
        let (m, p) = pick(&files, "a/b:BF16").unwrap();
        assert_eq!(m, ["Qwen3.5-0.8B-BF16.gguf"]);
        assert_eq!(p.as_deref(), Some("mmproj-F16.gguf"));
        match pick(&files, "a/b:Q5_K_M") {
            Err(PullError::QuantNotFound { quants, .. }) => {
                assert_eq!(quants, ["BF16", "IQ4_XS", "Q4_K_M", "Q6_K", "Q8_0"])
            }
            other => panic!("{other:?}"),
        }
        let (m, _) = pick(&listing(&["x-IQ4_XS.gguf", "x-F16.gguf"]), "a/b").unwrap();
        assert_eq!(m, ["x-IQ4_XS.gguf"]);
        assert!(matches!(
            pick(&listing(&["README.md"]), "a/b"),
            Err(PullError::NoGguf { .. })
        ));
    }

    #[test]
    fn split_files_come_whole_and_folders_scope_mmproj() {
        let files = listing(&[
            "Q4_K_M/M-Q4_K_M-00002-of-00002.gguf",
            "Q4_K_M/M-Q4_K_M-00001-of-00002.gguf",
            "Q8_0/M-Q8_0-00001-of-00002.gguf",
            "Q8_0/mmproj-Q8_0.gguf",
            "mmproj-F16.gguf",
        ]);
        let (m, p) = pick(&files, "a/b:Q4_K_M").unwrap();
        assert_eq!(
            m,
            [
                "Q4_K_M/M-Q4_K_M-00001-of-00002.gguf",
                "Q4_K_M/M-Q4_K_M-00002-of-00002.gguf"
            ]
        );
        assert_eq!(p.as_deref(), Some("mmproj-F16.gguf"));
        assert!(matches!(
            pick(&files, "a/b:Q8_0"),
            Err(PullError::MissingPart {
                part: 2,
                count: 2,
                ..
            })
        ));
        let (m, _) = pick(&files, "a/b/Q8_0/mmproj-Q8_0.gguf").unwrap();
        assert_eq!(m, ["Q8_0/mmproj-Q8_0.gguf"]);
        assert!(matches!(
            pick(&files, "a/b/nope.gguf"),
            Err(PullError::FileNotFound { .. })
        ));
    }
}
