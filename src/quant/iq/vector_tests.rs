//! IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 and MXFP4 against their references: the `gguf` package's dequantizers
//! and ggml's quantizers (tests/fixtures/iq4-vectors.gguf, tools/make_iq4_vectors.py), and llama-quantize's
//! IQ4 files of tiny-r2 with and without llama-imatrix's matrix (SHA-256 per tensor in
//! tests/fixtures/imatrix/quant).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytemuck::Zeroable;
use sha2::{Digest, Sha256};

use super::{BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockTQ1_0, BlockTQ2_0};
use crate::gguf::GgufFile;
use crate::quant::{
    dequantize_row, quantize_row, vec_dot_row, BlockFormat, GgmlType, ImatrixQuantize,
};

const TYPES: [GgmlType; 5] = [
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
];

fn fixture(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel);
    assert!(
        p.exists(),
        "{} is missing (shared fixtures: tools/fetch-fixtures.sh)",
        p.display()
    );
    p
}

fn vectors() -> GgufFile {
    GgufFile::open(fixture("iq4-vectors.gguf")).unwrap()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex(Sha256::digest(bytes))
}

fn sha256_f32(v: &[f32]) -> String {
    sha256(bytemuck::cast_slice(v))
}

fn dequantize(ty: GgmlType, data: &[u8]) -> Vec<f32> {
    let n = data.len() / ty.type_size() * ty.block_size();
    let mut out = vec![0f32; n];
    dequantize_row(ty, data, &mut out).unwrap();
    out
}

#[test]
fn dequantization_equals_gguf_py_on_random_blocks() {
    let f = vectors();
    for ty in TYPES {
        let name = format!("rand:{ty}");
        let (t, data) = f.tensor_by_name(&name).unwrap();
        assert_eq!(t.ty, ty);
        assert_eq!(
            sha256_f32(&dequantize(ty, data)),
            f.get_str(&format!("sha256.{name}")).unwrap(),
            "{ty}: dequantization differs from the gguf package"
        );
    }
}

/// The source rows of the fixture, one `Vec` per row.
fn source_rows(f: &GgufFile) -> Vec<Vec<f32>> {
    let (t, data) = f.tensor_by_name("src").unwrap();
    f32s(data)
        .chunks_exact(t.ne[0] as usize)
        .map(<[f32]>::to_vec)
        .collect()
}

fn expected_rows<'a>(f: &'a GgufFile, name: &str, rows: usize) -> Vec<&'a [u8]> {
    let (_, data) = f.tensor_by_name(name).unwrap();
    data.chunks_exact(data.len() / rows).collect()
}

#[test]
fn reference_quantizers_equal_ggml() {
    let f = vectors();
    let rows = source_rows(&f);
    for ty in TYPES {
        let expect = expected_rows(&f, &format!("ref:{ty}"), rows.len());
        for (i, (x, e)) in rows.iter().zip(expect).enumerate() {
            let mut out = vec![0u8; e.len()];
            quantize_row(ty, x, &mut out).unwrap();
            assert!(
                out == e,
                "{ty}: row {i} differs from ggml's reference quantizer"
            );
        }
    }
}

fn quantize_imatrix<B: ImatrixQuantize>(x: &[f32], qw: Option<&[f32]>) -> Vec<u8> {
    let mut out = vec![B::zeroed(); x.len() / B::BLOCK];
    B::quantize_row_imatrix(x, qw, &mut out);
    bytemuck::cast_slice(&out).to_vec()
}

fn quantize_imatrix_as(ty: GgmlType, x: &[f32], qw: Option<&[f32]>) -> Vec<u8> {
    match ty {
        GgmlType::IQ4_NL => quantize_imatrix::<BlockIQ4NL>(x, qw),
        GgmlType::IQ4_XS => quantize_imatrix::<BlockIQ4XS>(x, qw),
        other => panic!("no imatrix quantizer for {other}"),
    }
}

#[test]
fn imatrix_quantizers_equal_ggml() {
    let f = vectors();
    let rows = source_rows(&f);
    let (_, qw) = f.tensor_by_name("qw").unwrap();
    let qw = f32s(qw);
    for ty in [GgmlType::IQ4_NL, GgmlType::IQ4_XS] {
        for (tag, w) in [("noimx", None), ("imx", Some(qw.as_slice()))] {
            let expect = expected_rows(&f, &format!("{tag}:{ty}"), rows.len());
            for (i, (x, e)) in rows.iter().zip(expect).enumerate() {
                assert!(
                    quantize_imatrix_as(ty, x, w) == e,
                    "{ty} ({tag}): row {i} differs from ggml's quantize_{}",
                    ty.name().to_lowercase()
                );
            }
        }
    }
}

/// llama-quantize's view of the importance matrix (its per-column weights by tensor name), as
/// `deltaq quantize --imatrix` loads it.
fn load_imatrix(path: &Path) -> HashMap<String, Vec<f32>> {
    crate::quantize::Imatrix::load(path)
        .unwrap()
        .entries
        .into_iter()
        .collect()
}

/// Quantizes every tensor of tiny-r2 that `tsv` lists as `ty`, row by row (with the tensor's importance
/// weights when `imatrix` has them), and compares the SHA-256 of the data (and, when the TSV has a fourth
/// column, of the gguf package's dequantization of llama-quantize's data).
fn check_tiny_r2(ty: GgmlType, tsv: &str, imatrix: Option<&HashMap<String, Vec<f32>>>) {
    let model = GgufFile::open(fixture("shared/tiny-r2/tiny-r2-F32.gguf")).unwrap();
    let listing = std::fs::read_to_string(fixture(&format!("imatrix/quant/{tsv}"))).unwrap();
    let (mut checked, mut weighted) = (0, 0);
    for line in listing.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        if cols[1] != ty.name() {
            continue;
        }
        let (t, data) = model.tensor_by_name(cols[0]).unwrap();
        let x = f32s(data);
        let n = t.ne[0] as usize;
        let qw = imatrix.and_then(|m| m.get(cols[0]));
        weighted += qw.is_some() as usize;
        let mut q = Vec::new();
        for row in x.chunks_exact(n) {
            q.extend(quantize_imatrix_as(ty, row, qw.map(|w| &w[..n])));
        }
        assert_eq!(sha256(&q), cols[2], "{tsv}: {} differs", cols[0]);
        if let Some(deq) = cols.get(3) {
            assert_eq!(
                sha256_f32(&dequantize(ty, &q)),
                *deq,
                "{tsv}: dequantization of {} differs from the gguf package",
                cols[0]
            );
        }
        checked += 1;
    }
    assert!(checked > 60, "{tsv}: only {checked} tensors of type {ty}");
    if imatrix.is_some() {
        // Every weight matrix but token_embd and output has an entry.
        assert_eq!(
            weighted,
            checked - 2,
            "{tsv}: tensors with importance weights"
        );
    }
}

#[test]
fn tiny_r2_iq4_nl_with_imatrix_equals_llama_quantize() {
    let m = load_imatrix(&fixture("imatrix/tiny-r2.imatrix.gguf"));
    check_tiny_r2(GgmlType::IQ4_NL, "pure-IQ4_NL.tsv", Some(&m));
}

#[test]
fn tiny_r2_iq4_xs_with_imatrix_equals_llama_quantize() {
    let m = load_imatrix(&fixture("imatrix/tiny-r2.imatrix.gguf"));
    check_tiny_r2(GgmlType::IQ4_XS, "pure-IQ4_XS.tsv", Some(&m));
}

#[test]
fn tiny_r2_iq4_without_imatrix_equals_llama_quantize() {
    check_tiny_r2(GgmlType::IQ4_NL, "noimatrix-pure-IQ4_NL.tsv", None);
    check_tiny_r2(GgmlType::IQ4_XS, "noimatrix-pure-IQ4_XS.tsv", None);
}

/// IQ4_XS's reference quantizer is `quantize_iq4_xs` without weights.
#[test]
fn iq4_xs_reference_is_the_unweighted_row_quantizer() {
    let f = vectors();
    for x in source_rows(&f) {
        let mut out = vec![BlockIQ4XS::zeroed(); x.len() / 256];
        BlockIQ4XS::quantize(&x, &mut out);
        assert!(bytemuck::cast_slice::<_, u8>(&out) == quantize_imatrix::<BlockIQ4XS>(&x, None));
    }
}

/// The scalar dot products against Σ dequant(w)·dequant(a) in f64: they differ only by f32 rounding.
#[test]
fn vec_dot_matches_dequantized_product() {
    let f = vectors();
    let rows = source_rows(&f);
    for ty in TYPES {
        let (_, w) = f.tensor_by_name(&format!("ref:{ty}")).unwrap();
        let act = ty.vec_dot_type();
        let n = rows[0].len();
        let row_bytes = ty.row_bytes(n as u64).unwrap() as usize;
        let act_bytes = act.row_bytes(n as u64).unwrap() as usize;
        for (i, x) in rows.iter().enumerate() {
            let wr = &w[i * row_bytes..(i + 1) * row_bytes];
            let a: Vec<f32> = rows[(i + 3) % rows.len()].iter().map(|v| v.sin()).collect();
            let mut aq = vec![0u8; act_bytes];
            quantize_row(act, &a, &mut aq).unwrap();
            let (wd, ad) = (dequantize(ty, wr), dequantize(act, &aq));
            let exact: f64 = wd.iter().zip(&ad).map(|(&p, &q)| p as f64 * q as f64).sum();
            let scale: f64 = wd
                .iter()
                .zip(&ad)
                .map(|(&p, &q)| (p as f64 * q as f64).abs())
                .sum();
            let got = vec_dot_row(ty, wr, &aq).unwrap() as f64;
            assert!(
                (got - exact).abs() <= 1e-5 * scale + 1e-30,
                "{ty} row {i}: {got} vs {exact} (Σ|w·a| = {scale}, x[0] = {})",
                x[0]
            );
        }
    }
}

#[test]
fn block_sizes_and_partners() {
    assert_eq!(BlockIQ4NL::TYPE.vec_dot_type(), GgmlType::Q8_0);
    assert_eq!(BlockIQ4XS::TYPE.vec_dot_type(), GgmlType::Q8_K);
    assert_eq!(BlockTQ1_0::TYPE.vec_dot_type(), GgmlType::Q8_K);
    assert_eq!(BlockTQ2_0::TYPE.vec_dot_type(), GgmlType::Q8_K);
    assert_eq!(BlockMXFP4::TYPE.vec_dot_type(), GgmlType::Q8_0);
    for ty in TYPES {
        assert!(ty.can_dequantize(), "{ty}");
    }
}
