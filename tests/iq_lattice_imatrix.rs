//! The importance-weighted lattice quantizers against llama-quantize: every tiny-r2 matrix that
//! `llama-quantize --pure --imatrix` stored in an IQ2/IQ1 type, quantized here row by row with the same
//! importance matrix, must have the SHA-256 recorded in tests/fixtures/imatrix/quant/pure-<TYPE>.tsv
//! (tools/make-imatrix-vectors.sh). The F32 model is a shared fixture (tools/fetch-fixtures.sh).

use std::path::{Path, PathBuf};

use deltaq::gguf::GgufFile;
use deltaq::quant::iq::{BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
use deltaq::quant::{GgmlType, ImatrixQuantize};
use sha2::{Digest, Sha256};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn open(p: &Path) -> GgufFile {
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-fixtures.sh",
        p.display()
    );
    GgufFile::open(p).unwrap()
}

fn check<B: ImatrixQuantize>(tsv: &str) {
    let model = open(&root().join("shared/tiny-r2/tiny-r2-F32.gguf"));
    // llama-quantize's per-column weights, as `deltaq quantize --imatrix` loads them.
    let imx =
        deltaq::quantize::Imatrix::load(&root().join("imatrix/tiny-r2.imatrix.gguf")).unwrap();
    let table = std::fs::read_to_string(root().join("imatrix/quant").join(tsv)).unwrap();
    let (mut checked, mut bad) = (0, Vec::new());
    for line in table.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if GgmlType::from_name(f[1]) != Some(B::TYPE) {
            continue;
        }
        let (info, bytes) = model.tensor_by_name(f[0]).unwrap();
        let x: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let n = info.row_len() as usize;
        let qw = &imx.entries[f[0]];
        assert_eq!(qw.len(), n, "{}: importance length", f[0]);
        let mut out = vec![B::zeroed(); x.len() / B::BLOCK];
        for (row, q) in x.chunks_exact(n).zip(out.chunks_exact_mut(n / B::BLOCK)) {
            B::quantize_row_imatrix(row, Some(qw), q);
        }
        let digest = Sha256::digest(bytemuck::cast_slice::<B, u8>(&out));
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        checked += 1;
        if hex != f[2] {
            bad.push(f[0].to_string());
        }
    }
    assert!(checked > 0, "{tsv}: no {} tensors", B::TYPE);
    assert!(
        bad.is_empty(),
        "{}: {} of {checked} tensors differ from llama-quantize: {bad:?}",
        B::TYPE,
        bad.len()
    );
    eprintln!("{}: {checked} tensors identical", B::TYPE);
}

#[test]
fn iq2_xxs_matches_llama_quantize() {
    check::<BlockIQ2XXS>("pure-IQ2_XXS.tsv");
}

#[test]
fn iq2_xs_matches_llama_quantize() {
    check::<BlockIQ2XS>("pure-IQ2_XS.tsv");
}

#[test]
fn iq2_s_matches_llama_quantize() {
    check::<BlockIQ2S>("pure-IQ2_S.tsv");
}

#[test]
fn iq1_s_matches_llama_quantize() {
    check::<BlockIQ1S>("pure-IQ1_S.tsv");
}

#[test]
fn iq1_m_matches_llama_quantize() {
    check::<BlockIQ1M>("pure-IQ1_M.tsv");
}
