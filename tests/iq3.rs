//! IQ3_XXS and IQ3_S against llama.cpp: dequantization bit for bit against the `gguf` Python package
//! (tests/fixtures/iq3-dequant.gguf, tools/make_iq3_vectors.py), and the row quantizers byte for byte
//! against `llama-quantize` on the tiny-r2 model, with llama-imatrix's importance matrix
//! (tests/fixtures/imatrix/quant/pure-IQ3_*.tsv; token_embd and output have no imatrix entry and are
//! quantized without weights) and without one (noimatrix-pure-IQ3_S.tsv).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use deltaq::gguf::GgufFile;
use deltaq::quant::iq::{BlockIQ3S, BlockIQ3XXS};
use deltaq::quant::{dequantize_row, quantize_row, vec_dot_row, GgmlType, ImatrixQuantize};
use sha2::{Digest, Sha256};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn dequantization_equals_gguf_py() {
    let f = GgufFile::open(fixture("iq3-dequant.gguf")).unwrap();
    for ty in [GgmlType::IQ3_XXS, GgmlType::IQ3_S] {
        let (t, data) = f.tensor_by_name(ty.name()).unwrap();
        assert_eq!(t.ty, ty);
        let mut out = vec![0f32; t.n_elements() as usize];
        dequantize_row(ty, data, &mut out).unwrap();
        let mut h = Sha256::new();
        out.iter().for_each(|v| h.update(v.to_le_bytes()));
        let want = f.get_str(&format!("sha256.{}", ty.name())).unwrap();
        assert_eq!(hex(h.finalize()), want, "{ty}");
    }
}

/// The scalar dot product against the dequantized weights and activations in f64 (the integer sums
/// are exact; only the f32 scaling rounds).
#[test]
fn vec_dot_matches_dequantized_dot() {
    let f = GgufFile::open(fixture("iq3-dequant.gguf")).unwrap();
    for ty in [GgmlType::IQ3_XXS, GgmlType::IQ3_S] {
        let (t, data) = f.tensor_by_name(ty.name()).unwrap();
        let n = t.n_elements() as usize;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1013) as f32 / 500.0 - 1.0)
            .collect();
        let act = ty.vec_dot_type();
        let mut a = vec![0u8; act.row_bytes(n as u64).unwrap() as usize];
        quantize_row(act, &x, &mut a).unwrap();
        let (mut wf, mut af) = (vec![0f32; n], vec![0f32; n]);
        dequantize_row(ty, data, &mut wf).unwrap();
        dequantize_row(act, &a, &mut af).unwrap();
        // One block at a time: the fixture's scales span ±65504, so whole-row sums cancel.
        let (wb, ab) = (ty.type_size(), act.type_size());
        for b in 0..n / 256 {
            let got =
                vec_dot_row(ty, &data[b * wb..(b + 1) * wb], &a[b * ab..(b + 1) * ab]).unwrap();
            let r = b * 256..(b + 1) * 256;
            let want: f64 = wf[r.clone()]
                .iter()
                .zip(&af[r.clone()])
                .map(|(w, a)| *w as f64 * *a as f64)
                .sum();
            let mag: f64 = wf[r.clone()]
                .iter()
                .zip(&af[r])
                .map(|(w, a)| (*w as f64 * *a as f64).abs())
                .sum();
            assert!(
                (got as f64 - want).abs() <= 1e-6 * mag + 1e-30,
                "{ty} block {b}: {got} vs {want}"
            );
        }
    }
}

/// `llama-quantize`'s per-column weights, as `deltaq quantize --imatrix` loads them.
fn imatrix() -> HashMap<String, Vec<f32>> {
    deltaq::quantize::Imatrix::load(&fixture("imatrix/tiny-r2.imatrix.gguf"))
        .unwrap()
        .entries
        .into_iter()
        .collect()
}

fn quantize_tensor<B: ImatrixQuantize>(x: &[f32], ne0: usize, qw: Option<&[f32]>) -> Vec<u8> {
    let mut out = vec![B::zeroed(); x.len() / B::BLOCK];
    for (row, o) in x
        .chunks_exact(ne0)
        .zip(out.chunks_exact_mut(ne0 / B::BLOCK))
    {
        B::quantize_row_imatrix(row, qw, o);
    }
    bytemuck::cast_slice(&out).to_vec()
}

/// Quantizes every tensor the TSV lists in `ty` and compares its SHA-256; returns how many matched.
fn check_tsv(tsv: &str, ty: GgmlType, with_imatrix: bool) -> usize {
    let model = GgufFile::open(fixture("shared/tiny-r2/tiny-r2-F32.gguf")).unwrap();
    let imx = if with_imatrix {
        imatrix()
    } else {
        HashMap::new()
    };
    let text = std::fs::read_to_string(fixture(&format!("imatrix/quant/{tsv}"))).unwrap();
    let mut checked = 0;
    for line in text.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        if cols[1] != ty.name() {
            continue;
        }
        let (t, data) = model.tensor_by_name(cols[0]).unwrap();
        let x = f32s(data);
        let ne0 = t.ne[0] as usize;
        let qw = imx.get(cols[0]).map(|v| v.as_slice());
        if let Some(qw) = qw {
            assert_eq!(qw.len(), ne0, "{}", cols[0]);
        }
        let bytes = match ty {
            GgmlType::IQ3_XXS => quantize_tensor::<BlockIQ3XXS>(&x, ne0, qw),
            GgmlType::IQ3_S => quantize_tensor::<BlockIQ3S>(&x, ne0, qw),
            _ => unreachable!(),
        };
        assert_eq!(
            hex(Sha256::digest(&bytes)),
            cols[2],
            "{tsv}: {} (imatrix: {})",
            cols[0],
            qw.is_some()
        );
        checked += 1;
    }
    checked
}

#[test]
fn iq3_xxs_with_imatrix_equals_llama_quantize() {
    assert_eq!(check_tsv("pure-IQ3_XXS.tsv", GgmlType::IQ3_XXS, true), 64);
}

#[test]
fn iq3_s_with_imatrix_equals_llama_quantize() {
    assert_eq!(check_tsv("pure-IQ3_S.tsv", GgmlType::IQ3_S, true), 64);
}

#[test]
fn iq3_s_without_imatrix_equals_llama_quantize() {
    assert_eq!(
        check_tsv("noimatrix-pure-IQ3_S.tsv", GgmlType::IQ3_S, false),
        64
    );
}

/// The reference quantizer (`quantize_row`, no weights) on smooth rows: a small relative error.
#[test]
fn reference_quantizer_round_trips() {
    for ty in [GgmlType::IQ3_XXS, GgmlType::IQ3_S] {
        let n = 4 * 256;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i / 256) as f32))
            .collect();
        let mut q = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
        quantize_row(ty, &x, &mut q).unwrap();
        let mut y = vec![0f32; n];
        dequantize_row(ty, &q, &mut y).unwrap();
        let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let sig: f32 = x.iter().map(|a| a * a).sum();
        assert!(err / sig < 0.05, "{ty}: relative error {}", err / sig);
    }
}

/// Zero and near-zero sub-blocks (IQ3_S's shifted code cursors, IQ3_XXS's 1e-8 threshold, all-zero
/// super-blocks): blk.0.ffn_up.weight edited as tools/make-iq3-edge-vectors.sh does, against
/// llama-quantize (tests/fixtures/imatrix/quant/edge-IQ3.tsv).
#[test]
fn zero_sub_blocks_equal_llama_quantize() {
    let model = GgufFile::open(fixture("shared/tiny-r2/tiny-r2-F32.gguf")).unwrap();
    let name = "blk.0.ffn_up.weight";
    let (t, data) = model.tensor_by_name(name).unwrap();
    let ne0 = t.ne[0] as usize;
    let mut x = f32s(data);
    for (row, xr) in x.chunks_exact_mut(ne0).enumerate() {
        for blk in xr.chunks_exact_mut(256) {
            match row % 4 {
                0 => {
                    blk[32..64].fill(0.0);
                    blk[128..160].fill(0.0);
                }
                1 => {
                    for r in [64..96, 192..224] {
                        blk[r].iter_mut().for_each(|v| *v *= 1e-10);
                    }
                }
                _ => {}
            }
        }
        if row % 4 == 2 {
            xr[..256].fill(0.0);
        }
    }
    let imx = imatrix();
    let text = std::fs::read_to_string(fixture("imatrix/quant/edge-IQ3.tsv")).unwrap();
    let mut checked = 0;
    for line in text.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let qw = (cols[0] == "imatrix").then(|| imx[name].as_slice());
        let bytes = match cols[1] {
            "IQ3_XXS" => quantize_tensor::<BlockIQ3XXS>(&x, ne0, qw),
            "IQ3_S" => quantize_tensor::<BlockIQ3S>(&x, ne0, qw),
            other => panic!("type {other}"),
        };
        assert_eq!(hex(Sha256::digest(&bytes)), cols[2], "{line}");
        checked += 1;
    }
    assert_eq!(checked, 3);
}
