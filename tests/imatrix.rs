//! `deltaq imatrix` against llama-imatrix's matrices of tiny-r2 (tests/fixtures/imatrix, made with
//! `llama-imatrix -m tiny-r2-F32.gguf -f eval-john.txt -c 128 --chunks 8 -t 2`): the GGUF file's
//! header (metadata, tensor names, order, shapes, offsets) byte for byte, the counts exactly, every sum
//! of squares within 2e-4 relative (measured: at most 1.1e-4, in `blk.7.attn_output`, whose input
//! comes out of llama.cpp's attention, which rounds queries and weights to f16; every other tensor within
//! 3.3e-5); the same for the legacy .dat format. With an f32 cache and llama.cpp's flash attention off,
//! within 1e-4 everywhere.

use std::path::{Path, PathBuf};
use std::process::Command;

use deltaq::gguf::GgufFile;

/// Largest relative difference allowed between our sums and llama-imatrix's.
const TOL: f64 = 2e-4;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn model() -> PathBuf {
    let p = repo("tests/fixtures/shared/tiny-r2/tiny-r2-F32.gguf");
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-fixtures.sh",
        p.display()
    );
    p
}

/// Runs `deltaq imatrix` in `dir` (where the text is `eval-john.txt`, so that the dataset recorded is
/// that name, as in the fixture) and returns the output file.
fn run_imatrix(dir: &Path, out: &str, extra: &[&str]) -> PathBuf {
    std::fs::copy(
        repo("tests/fixtures/shared/text/eval-john.txt"),
        dir.join("eval-john.txt"),
    )
    .unwrap();
    let model = model();
    let mut args = vec![
        "imatrix",
        "-m",
        model.to_str().unwrap(),
        "-f",
        "eval-john.txt",
        "-c",
        "128",
        "--chunks",
        "8",
        "-t",
        "2",
        "-o",
        out,
    ];
    args.extend_from_slice(extra);
    let o = Command::new(env!("CARGO_BIN_EXE_deltaq"))
        .args(&args)
        .current_dir(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "deltaq imatrix failed: {stderr}");
    // The running perplexity, as llama-imatrix prints it.
    assert!(
        stderr.contains("[8]") && stderr.contains("Final estimate: PPL = "),
        "{stderr}"
    );
    dir.join(out)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Max relative difference of `ours` from `theirs`; panics (naming `what`) beyond [`TOL`].
fn compare(what: &str, ours: &[f32], theirs: &[f32]) -> f64 {
    compare_within(what, ours, theirs, TOL)
}

/// [`compare`] with tolerance `tol`.
fn compare_within(what: &str, ours: &[f32], theirs: &[f32], tol: f64) -> f64 {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    let mut worst = 0f64;
    for (i, (&a, &b)) in ours.iter().zip(theirs).enumerate() {
        let rel = (a as f64 - b as f64).abs() / (b as f64).abs().max(f64::MIN_POSITIVE);
        assert!(
            rel <= tol,
            "{what}[{i}]: ours {a}, llama-imatrix {b} (relative difference {rel:.2e})"
        );
        worst = worst.max(rel);
    }
    worst
}

/// With an f32 KV cache on both sides (`llama-imatrix -ctk f32 -ctv f32 -fa off`, fixture
/// tiny-r2-kvf32.imatrix.gguf) llama.cpp's attention no longer rounds its queries and weights to f16, and
/// every value is within 1e-4 relative (measured: 9.6e-6 at most, in `blk.5.ssm_out`; the f16 run's
/// 1.1e-4 in `blk.7.attn_output` is that rounding).
#[test]
fn f32_kv_matches_llama_imatrix_within_1e_4() {
    let dir = tempfile::tempdir().unwrap();
    let ours = run_imatrix(dir.path(), "ours.gguf", &["--kv-type", "f32"]);
    let (a, b) = (
        GgufFile::open(&ours).unwrap(),
        GgufFile::open(repo("tests/fixtures/imatrix/tiny-r2-kvf32.imatrix.gguf")).unwrap(),
    );
    let head = a.data_start as usize;
    assert!(a.bytes()[..head] == b.bytes()[..head], "the headers differ");
    let mut worst = 0f64;
    for (ta, tb) in a.tensors().iter().zip(b.tensors()) {
        let (va, vb) = (f32s(a.tensor_data(ta)), f32s(b.tensor_data(tb)));
        if ta.name.ends_with(".counts") {
            assert_eq!(va, vb, "{}", ta.name);
        } else {
            worst = worst.max(compare_within(&ta.name, &va, &vb, 1e-4));
        }
    }
    eprintln!("max relative difference from llama-imatrix with f32 KV: {worst:.2e}");
}

#[test]
fn gguf_matches_llama_imatrix() {
    let dir = tempfile::tempdir().unwrap();
    let ours = run_imatrix(dir.path(), "ours.gguf", &[]);
    let (a, b) = (
        GgufFile::open(&ours).unwrap(),
        GgufFile::open(repo("tests/fixtures/imatrix/tiny-r2.imatrix.gguf")).unwrap(),
    );
    // Metadata (keys, order, values) and tensor infos (names, order, shapes, types, offsets).
    assert_eq!(a.data_start, b.data_start);
    let head = a.data_start as usize;
    assert!(a.bytes()[..head] == b.bytes()[..head], "the headers differ");
    assert_eq!(a.bytes().len(), b.bytes().len());
    assert_eq!(a.get_str("general.type").unwrap(), "imatrix");
    assert_eq!(a.get_u64("imatrix.chunk_count").unwrap(), 8);
    assert_eq!(a.get_u64("imatrix.chunk_size").unwrap(), 128);
    assert_eq!(a.tensors().len(), 124);
    let mut worst = 0f64;
    for (ta, tb) in a.tensors().iter().zip(b.tensors()) {
        let (va, vb) = (f32s(a.tensor_data(ta)), f32s(b.tensor_data(tb)));
        if ta.name.ends_with(".counts") {
            assert_eq!(va, vb, "{}", ta.name);
            assert_eq!(va, [1024.0], "{}", ta.name);
        } else {
            worst = worst.max(compare(&ta.name, &va, &vb));
        }
    }
    eprintln!("max relative difference from llama-imatrix: {worst:.2e}");
}

/// The legacy format's entries: (name, ncall, values), then the chunk count and the dataset.
type Dat = (Vec<(String, i32, Vec<f32>)>, i32, String);

fn parse_dat(b: &[u8]) -> Dat {
    let mut p = 0;
    let i32_at = |p: &mut usize| {
        let v = i32::from_le_bytes(b[*p..*p + 4].try_into().unwrap());
        *p += 4;
        v
    };
    let n = i32_at(&mut p);
    let mut entries = Vec::new();
    for _ in 0..n {
        let len = i32_at(&mut p) as usize;
        let name = String::from_utf8(b[p..p + len].to_vec()).unwrap();
        p += len;
        let ncall = i32_at(&mut p);
        let nval = i32_at(&mut p) as usize;
        let vals = f32s(&b[p..p + 4 * nval]);
        p += 4 * nval;
        entries.push((name, ncall, vals));
    }
    let chunks = i32_at(&mut p);
    let len = i32_at(&mut p) as usize;
    let dataset = String::from_utf8(b[p..p + len].to_vec()).unwrap();
    assert_eq!(p + len, b.len(), "trailing bytes");
    (entries, chunks, dataset)
}

#[test]
fn dat_matches_llama_imatrix() {
    let dir = tempfile::tempdir().unwrap();
    let ours = run_imatrix(dir.path(), "ours.dat", &["--output-format", "dat"]);
    let (a, b) = (
        parse_dat(&std::fs::read(ours).unwrap()),
        parse_dat(&std::fs::read(repo("tests/fixtures/imatrix/tiny-r2.imatrix.dat")).unwrap()),
    );
    assert_eq!((a.1, &a.2), (8, &"eval-john.txt".to_string()));
    assert_eq!((a.1, &a.2), (b.1, &b.2));
    assert_eq!(a.0.len(), 62);
    assert_eq!(a.0.len(), b.0.len());
    let mut worst = 0f64;
    for ((na, ca, va), (nb, cb, vb)) in a.0.iter().zip(&b.0) {
        assert_eq!((na, ca), (nb, cb));
        worst = worst.max(compare(na, va, vb));
    }
    eprintln!("max relative difference from llama-imatrix (.dat): {worst:.2e}");
}

#[test]
fn too_short_a_text_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("short.txt"), "In the beginning").unwrap();
    let model = model();
    let o = Command::new(env!("CARGO_BIN_EXE_deltaq"))
        .args(["imatrix", "-m", model.to_str().unwrap(), "-f", "short.txt"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(stderr.contains("needs at least 1024 tokens"), "{stderr}");
    assert!(!dir.path().join("imatrix.gguf").exists());
}
