//! tiny-kjv, a trained Qwen3.5-architecture model: our own F32 conversion of its checkpoint against
//! transformers' float32 goldens (logits and the residual stream after every layer), and the bundled
//! Q8_0 demo model against the same logits within Q8_0 tolerance.

use std::path::{Path, PathBuf};

use deltaq::convert::{convert, ConvertOptions};
use deltaq::gguf::GgufFile;
use deltaq::model::{KvType, Model, Session};
use deltaq::npy::{self, NpyArray};
use deltaq::quantize::FileType;

fn shared(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/shared/tiny-kjv")
        .join(rel);
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-fixtures.sh",
        p.display()
    );
    p
}

fn golden(name: &str) -> NpyArray {
    npy::read(&shared(&format!("golden/{name}"))).unwrap()
}

fn tokens() -> Vec<u32> {
    golden("tokens.npy")
        .data
        .iter()
        .map(|&t| t as u32)
        .collect()
}

/// Largest |a - b| per row of `n` values.
fn row_max_diff(a: &[f32], b: &[f64], n: usize) -> Vec<f64> {
    a.chunks(n)
        .zip(b.chunks(n))
        .map(|(a, b)| {
            a.iter()
                .zip(b)
                .map(|(&x, &y)| (x as f64 - y).abs())
                .fold(0.0, f64::max)
        })
        .collect()
}

fn range(row: &[f64]) -> f64 {
    row.iter().cloned().fold(f64::MIN, f64::max) - row.iter().cloned().fold(f64::MAX, f64::min)
}

/// Runs the golden prompt in one batch with a `kv` KV cache; returns logits and the residual stream
/// after every layer.
fn run(f: &GgufFile, kv: KvType) -> (Vec<f32>, Vec<Vec<f32>>) {
    let model = Model::load(f).unwrap();
    let mut s = Session::with_kv_type(&model, None, kv);
    let mut layers = vec![Vec::new(); model.hp.n_layer];
    let logits = s
        .forward_observed(&tokens(), &mut |l, _, x| layers[l].extend_from_slice(x))
        .unwrap();
    (logits, layers)
}

fn f32_conversion(dir: &Path) -> GgufFile {
    let out = dir.join("kjv-f32.gguf");
    let opts = ConvertOptions {
        outtype: FileType::F32,
        no_mtp: true,
        model_name: None,
        overwrite: false,
        progress: false,
    };
    convert(&shared("hf"), &out, &opts).unwrap();
    GgufFile::open(&out).unwrap()
}

#[test]
fn own_f32_conversion_matches_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let f = f32_conversion(dir.path());
    // The F32 KV cache: this holds the whole forward pass to float32 noise, which F16 rounding of K
    // and V exceeds (model_golden.rs checks the F16 cache against the F32 one).
    let (logits, layers) = run(&f, KvType::F32);

    let gold_layers = golden("layer_outputs.npy");
    let d = 256;
    let per_layer = 64 * d;
    for (l, x) in layers.iter().enumerate() {
        let g = &gold_layers.data[l * per_layer..(l + 1) * per_layer];
        let scale = g.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = row_max_diff(x, g, d).into_iter().fold(0.0, f64::max);
        assert!(
            worst <= 1e-4 * scale.max(1.0),
            "layer {l}: residual differs by {worst} (scale {scale})"
        );
    }

    let gold = golden("logits.npy");
    let v = gold.shape[1];
    let diffs = row_max_diff(&logits, &gold.data, v);
    for (p, d) in diffs.iter().enumerate() {
        let r = range(&gold.data[p * v..(p + 1) * v]);
        assert!(
            *d <= 1e-3 * r,
            "position {p}: max |Δlogit| {d} > 1e-3 × range {r}"
        );
    }
    let worst = diffs.iter().cloned().fold(0.0, f64::max);
    // The README measures ~1.5e-5 between float32 and float64 transformers: we should be close to that.
    assert!(worst < 2e-3, "max |Δlogit| {worst}");
    eprintln!("tiny-kjv F32: max |Δlogit| {worst:.3e}");
}

#[test]
fn demo_model_q8_0_is_close_to_transformers() {
    let f =
        GgufFile::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-kjv-mtp-Q8_0.gguf"))
            .unwrap();
    let (logits, _) = run(&f, KvType::default());
    let gold = golden("logits.npy");
    let v = gold.shape[1];
    let worst = row_max_diff(&logits, &gold.data, v)
        .into_iter()
        .fold(0.0, f64::max);
    let mut top1 = 0;
    for p in 0..64 {
        let am = |row: &[f32]| (0..v).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
        let g: Vec<f32> = gold.data[p * v..(p + 1) * v]
            .iter()
            .map(|&x| x as f32)
            .collect();
        top1 += (am(&logits[p * v..(p + 1) * v]) == am(&g)) as usize;
    }
    // llama.cpp on its own Q8_0 file: max |Δlogit| 0.220 (fixture README).
    assert!(worst < 0.3, "Q8_0 demo model: max |Δlogit| {worst}");
    assert!(top1 >= 60, "top-1 agreement {top1}/64");
    eprintln!("tiny-kjv Q8_0: max |Δlogit| {worst:.3e}, top-1 {top1}/64");
}

/// The README's greedy samples (transformers, float32, token by token through the cache), reproduced
/// with the default F16 KV cache.
#[test]
fn greedy_samples_match_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let f = f32_conversion(dir.path());
    let model = Model::load(&f).unwrap();
    let cases: [(&[u32], &[u32]); 2] = [
        (
            &[3414, 258, 2199],
            &[
                268, 258, 1029, 268, 258, 409, 13, 571, 258, 409, 393, 11, 460, 572, 268, 258, 338,
                459, 500, 322, 375, 11, 267, 296, 398, 1208, 322, 396, 268, 361, 300, 359, 591,
                837, 13, 571, 258, 409, 268, 432, 267, 361, 432, 811, 258, 853, 268, 258, 409, 268,
                432, 13, 571, 258, 409, 268, 432, 267, 361, 432,
            ],
        ),
        (
            &[2225, 338, 340, 381, 3677, 26],
            &[
                267, 296, 394, 664, 258, 494, 481, 258, 477, 268, 258, 2109, 11, 267, 481, 258,
                477, 268, 258, 2109, 13, 298, 296, 394, 588, 258, 494, 268, 726, 1722, 11, 267,
                258, 494, 311, 295, 1722, 11, 267, 258, 494, 311, 295, 1722, 11, 267, 258, 494,
                311, 295, 1722, 11, 267, 258, 494, 311, 295, 1722, 11, 267,
            ],
        ),
    ];
    for (prompt, want) in cases {
        let mut s = Session::new(&model, None);
        let mut logits = s.forward_last(prompt).unwrap();
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let id = (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap() as u32;
            got.push(id);
            logits = s.forward_last(&[id]).unwrap();
        }
        assert_eq!(got, want, "greedy continuation of {prompt:?}");
    }
}
