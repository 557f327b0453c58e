//! The `inspect` and `tensor` subcommands, run as a user would.

use std::path::{Path, PathBuf};
use std::process::Command;

use deltaq::gguf::GgufFile;
use sha2::{Digest, Sha256};

fn deltaq() -> Command {
    Command::new(env!("CARGO_BIN_EXE_deltaq"))
}

fn vectors() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant-vectors.gguf")
}

#[test]
fn inspect_lists_every_tensor_with_type_and_shape() {
    let out = deltaq().arg("inspect").arg(vectors()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let f = GgufFile::open(vectors()).unwrap();
    for t in f.tensors() {
        let line = text
            .lines()
            .find(|l| l.ends_with(&format!("| {}", t.name)))
            .unwrap_or_else(|| panic!("{} not listed", t.name));
        assert!(line.contains(&format!("| {:<7} |", t.ty.name())), "{line}");
        assert!(
            line.contains(&format!("{:>6}, {:>6},", t.ne[0], t.ne[1])),
            "{line}"
        );
        assert!(line.contains(&format!("| {:>12} |", t.nbytes)), "{line}");
    }
    assert!(text.contains("* Total: 240 tensors"), "{text}");
    assert!(text.contains("general.architecture = \"deltaq-quant-vectors\""));
}

#[test]
fn tensor_writes_the_gguf_py_dequantization_as_npy() {
    let dir = tempfile::tempdir().unwrap();
    let f = GgufFile::open(vectors()).unwrap();
    for name in [
        "pure-Q4_K:blk.0.attn_qkv.weight",
        "Q2_K:token_embd.weight",
        "pure-Q5_1:blk.7.ffn_down.weight",
    ] {
        let npy = dir.path().join("t.npy");
        let out = deltaq()
            .arg("tensor")
            .arg(vectors())
            .arg(name)
            .arg("-o")
            .arg(&npy)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let a = deltaq::npy::read(&npy).unwrap();
        let t = f.tensor(name).unwrap();
        assert_eq!(
            a.shape,
            vec![t.ne[1] as usize, t.ne[0] as usize],
            "PyTorch order"
        );
        let mut h = Sha256::new();
        for v in &a.data {
            h.update((*v as f32).to_le_bytes());
        }
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, f.get_str(&format!("sha256.{name}")).unwrap(), "{name}");
    }
}

#[test]
fn clear_errors_for_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\0\0\0\xff\xff").unwrap();
    let out = deltaq().arg("inspect").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error:") && err.contains("truncated"),
        "{err}"
    );

    let out = deltaq()
        .args(["tensor"])
        .arg(vectors())
        .arg("no.such.tensor")
        .arg("-o")
        .arg(dir.path().join("x.npy"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing tensor 'no.such.tensor'"));
}
