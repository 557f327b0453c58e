//! `deltaq perplexity` against llama-perplexity's numbers for tiny-kjv on eval-john (`-c 512`), the
//! ordering of quantization levels in a sweep, the SVG plot and the error messages.
//!
//! llama-perplexity (llama.cpp 0c1e57098, `-c 512 -t 2`) on eval-john: F32 47.1945, Q8_0 47.1658,
//! Q4_K_M 47.3775, Q2_K 51.9441; KL divergence from F32: Q8_0 0.000561 (98.40 % same top-1),
//! Q4_K_M 0.020890 (90.18 %), Q2_K 0.278426 (67.58 %).

use std::path::{Path, PathBuf};
use std::process::Command;

use deltaq::convert::{convert, ConvertOptions};
use deltaq::gguf::GgufFile;
use deltaq::model::Model;
use deltaq::perplexity::{self as ppl, Options, Plan};
use deltaq::quantize::{quantize_file, FileType, QuantizeOptions};
use deltaq::tokenizer::Tokenizer;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn eval_text() -> PathBuf {
    repo("eval/eval-john.txt")
}

fn hf_dir() -> PathBuf {
    let p = repo("tests/fixtures/shared/tiny-kjv/hf");
    assert!(
        p.join("model.safetensors").exists(),
        "{} is missing: run tools/fetch-fixtures.sh",
        p.display()
    );
    p
}

/// Our F32 conversion of tiny-kjv's checkpoint, in `dir`.
fn f32_gguf(dir: &Path) -> PathBuf {
    let out = dir.join("tiny-kjv-F32.gguf");
    let opts = ConvertOptions {
        outtype: FileType::F32,
        no_mtp: true,
        model_name: None,
        overwrite: false,
        progress: false,
    };
    convert(&hf_dir(), &out, &opts).unwrap();
    out
}

fn quantize(src: &Path, ty: FileType) -> PathBuf {
    let out = src.with_file_name(format!("tiny-kjv-{}.gguf", ty.name()));
    let opts = QuantizeOptions {
        ftype: ty,
        pure: false,
        keep: Vec::new(),
        overwrite: false,
        progress: false,
        imatrix: None,
        token_embedding_type: None,
        output_tensor_type: None,
        tensor_types: Vec::new(),
    };
    quantize_file(src, &out, &opts).unwrap();
    out
}

fn deltaq(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_deltaq"))
        .arg("perplexity")
        .args(args)
        .output()
        .unwrap()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b) / b
}

/// The whole text, F32 (our conversion) as the base and the bundled Q8_0 demo model, in one pass.
#[test]
fn full_text_matches_llama_perplexity() {
    let dir = tempfile::tempdir().unwrap();
    let f32_path = f32_gguf(dir.path());
    let f32_file = GgufFile::open(&f32_path).unwrap();
    let q8_file = GgufFile::open(repo("models/tiny-kjv-mtp-Q8_0.gguf")).unwrap();
    let (m32, m8) = (
        Model::load(&f32_file).unwrap(),
        Model::load(&q8_file).unwrap(),
    );
    let tok = Tokenizer::from_gguf(&f32_file).unwrap();
    let text = ppl::text_from_bytes(std::fs::read(eval_text()).unwrap(), "eval-john").unwrap();
    let tokens = ppl::tokenize(&tok, &text).unwrap();
    assert_eq!(
        tokens.len(),
        24154,
        "llama.cpp tokenizes eval-john to 24,154 tokens"
    );
    let plan = Plan::new(tokens.len(), &Options::default()).unwrap();
    assert_eq!((plan.n_chunk, plan.n_scored()), (47, 255));

    let s = ppl::evaluate(&[&m32, &m8], 0, &tokens, &plan, &mut |_| {}, None).unwrap();
    let (p32, p8) = (s[0].ppl(), s[1].ppl());
    let kl = s[1].kl.clone().unwrap();
    eprintln!(
        "F32 {p32:.4} ± {:.5} (llama-perplexity 47.1945, {:+.4} %), Q8_0 {p8:.4} (47.1658, {:+.4} %), \
         Q8_0 KL {:.6} (0.000561), same top-1 {:.2} % (98.40 %)",
        s[0].ppl_err(),
        100.0 * rel(p32, 47.1945),
        100.0 * rel(p8, 47.1658),
        kl.mean,
        100.0 * kl.same_top
    );
    assert_eq!(s[0].nll.count, 47 * 255);
    // F32: the same arithmetic up to summation order: within 0.1 % (measured: +0.0004 %).
    assert!(rel(p32, 47.1945).abs() < 1e-3, "F32 ppl {p32}");
    // The "+/-" (llama-perplexity's formula); measured 1.27759.
    assert!(
        (s[0].ppl_err() - 1.2776).abs() < 0.01,
        "F32 err {}",
        s[0].ppl_err()
    );
    // Q8_0: llama.cpp also rounds the activations to 8 bits before its Q8_0 dot products, we keep them
    // in f32, so the two differ by more than F32 does; 0.2 % is several times the measured difference and
    // far below the Q8_0-vs-F32 spread of the lower types.
    assert!(rel(p8, 47.1658).abs() < 2e-3, "Q8_0 ppl {p8}");
    assert!(kl.mean > 0.0 && kl.mean < 0.002, "Q8_0 KL {}", kl.mean);
    assert!(kl.same_top > 0.97, "Q8_0 same top-1 {}", kl.same_top);
    assert!(kl.median <= kl.mean && kl.mean <= kl.p99 && kl.p99 <= kl.max);
}

/// Minimal structural check of an SVG document: balanced tags, one root `<svg>`.
fn check_svg(svg: &str) {
    assert!(svg.trim_start().starts_with("<svg"), "not an SVG document");
    assert!(svg.trim_end().ends_with("</svg>"));
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find('<') {
        let j = rest[i..].find('>').expect("unterminated tag") + i;
        let tag = &rest[i + 1..j];
        assert!(!tag.contains('<'), "'<' inside a tag: {tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "mismatched </{name}>"
            );
        } else if !tag.ends_with('/') {
            let name = tag.split_whitespace().next().unwrap().to_string();
            stack.push(name);
        }
        let text = &rest[j + 1..rest[j + 1..].find('<').map_or(rest.len(), |k| k + j + 1)];
        assert!(!text.contains('>'), "stray '>' in text {text:?}");
        rest = &rest[j + 1..];
        if stack.is_empty() {
            assert!(rest.trim().is_empty(), "content after the root element");
        }
    }
    assert!(stack.is_empty(), "unclosed tags {stack:?}");
}

/// A `<text>` element of the SVG: where it is drawn and what it says.
#[derive(Debug)]
struct SvgText {
    x: f64,
    y: f64,
    size: f64,
    anchor: String,
    dy: String,
    text: String,
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = tag[start..].find('"')? + start;
    Some(tag[start..end].to_string())
}

fn texts(svg: &str) -> Vec<SvgText> {
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find("<text") {
        let open_end = rest[i..].find('>').unwrap() + i;
        let close = rest[open_end..].find("</text>").unwrap() + open_end;
        let tag = &rest[i..open_end];
        let num = |n: &str| {
            attr(tag, n)
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN)
        };
        out.push(SvgText {
            x: num("x"),
            y: num("y"),
            size: num("font-size"),
            anchor: attr(tag, "text-anchor").unwrap_or_default(),
            dy: attr(tag, "dy").unwrap_or_default(),
            text: rest[open_end + 1..close].trim().to_string(),
        });
        rest = &rest[close..];
    }
    out
}

/// Each point label (a text ending in one of `names`' file names) appears once per panel, drawn
/// inside the picture, and no two point labels overlap (boxes estimated as generously as the plot
/// does).
fn check_labels(svg: &str, names: &[&str], panels: usize) {
    let height: f64 = attr(&svg[..svg.find('>').unwrap()], "height")
        .unwrap()
        .parse()
        .unwrap();
    let width: f64 = attr(&svg[..svg.find('>').unwrap()], "width")
        .unwrap()
        .parse()
        .unwrap();
    let labels: Vec<SvgText> = texts(svg)
        .into_iter()
        .filter(|t| names.iter().any(|n| t.text.ends_with(&format!("{n}.gguf"))))
        .collect();
    for n in names {
        let mine: Vec<&SvgText> = labels
            .iter()
            .filter(|t| t.text.ends_with(&format!("{n}.gguf")))
            .collect();
        assert_eq!(mine.len(), panels, "{n}: {mine:?}");
        let mut halves: Vec<usize> = mine
            .iter()
            .map(|t| (t.y / height * panels as f64) as usize)
            .collect();
        halves.sort_unstable();
        assert_eq!(
            halves,
            (0..panels).collect::<Vec<_>>(),
            "{n}: one per panel"
        );
    }
    let boxes: Vec<(f64, f64, f64, f64)> = labels
        .iter()
        .map(|t| {
            assert_eq!(
                (t.anchor.as_str(), t.dy.as_str()),
                ("start", "0.76em"),
                "{t:?}"
            );
            let w = 0.68 * t.size * t.text.chars().count() as f64;
            (t.x, t.y, t.x + w, t.y + t.size)
        })
        .collect();
    for (i, a) in boxes.iter().enumerate() {
        assert!(
            a.0 >= 0.0 && a.1 >= 0.0 && a.2 <= width && a.3 <= height,
            "{:?} outside the picture",
            labels[i]
        );
        for (j, b) in boxes.iter().enumerate().skip(i + 1) {
            let apart = a.2 <= b.0 || b.2 <= a.0 || a.3 <= b.1 || b.3 <= a.1;
            assert!(apart, "{:?} overlaps {:?}", labels[i], labels[j]);
        }
    }
}

/// F32 (twice: the second copy is compared with the first) + Q8_0 + Q4_K_M + Q2_K on the first windows,
/// through the command line with --json, --plot and --save-logits.
#[test]
fn sweep_orders_quant_levels() {
    let dir = tempfile::tempdir().unwrap();
    let f32_path = f32_gguf(dir.path());
    let q8 = quantize(&f32_path, FileType::Q8_0);
    let q4 = quantize(&f32_path, FileType::Q4_K_M);
    let q2 = quantize(&f32_path, FileType::Q2_K);
    let svg = dir.path().join("plot.svg");
    let logits = dir.path().join("base.logits");
    let files = [&f32_path, &f32_path, &q8, &q4, &q2];
    let mut args: Vec<String> = Vec::new();
    for f in files {
        args.extend(["-m".into(), f.display().to_string()]);
    }
    let chunks = 3;
    args.extend(
        [
            "-f",
            &eval_text().display().to_string(),
            "--chunks",
            &chunks.to_string(),
            "--json",
            "--plot",
            &svg.display().to_string(),
            "--save-logits",
            &logits.display().to_string(),
        ]
        .map(String::from),
    );
    let out = deltaq(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), files.len());
    for r in &rows {
        eprintln!("{r}");
    }
    let f = |i: usize, k: &str| {
        rows[i][k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} of row {i}"))
    };
    let types: Vec<&str> = rows.iter().map(|r| r["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["F32", "F32", "Q8_0", "Q4_K_M", "Q2_K"]);
    assert_eq!(rows[0]["base"], true);
    // The base against itself: no divergence at all.
    assert_eq!(f(1, "kl_mean"), 0.0);
    assert_eq!(f(1, "kl_max"), 0.0);
    assert_eq!(f(1, "top1"), 100.0);
    assert_eq!(f(1, "ppl"), f(0, "ppl"));
    // Fewer bits: larger KL divergence, fewer same top-1 tokens, higher perplexity (Q8_0 is within noise
    // of F32, as in llama-perplexity, where it is even slightly lower).
    assert!(
        0.0 < f(2, "kl_mean")
            && f(2, "kl_mean") < f(3, "kl_mean")
            && f(3, "kl_mean") < f(4, "kl_mean")
    );
    assert!(f(2, "kl_p99") < f(3, "kl_p99") && f(3, "kl_p99") < f(4, "kl_p99"));
    assert!(f(2, "top1") > f(3, "top1") && f(3, "top1") > f(4, "top1"));
    assert!(rel(f(2, "ppl"), f(0, "ppl")).abs() < 0.005);
    assert!(f(3, "ppl") > f(0, "ppl").min(f(2, "ppl")) && f(4, "ppl") > f(3, "ppl"));
    assert!(f(0, "bpw") > f(2, "bpw") && f(2, "bpw") > f(3, "bpw") && f(3, "bpw") > f(4, "bpw"));
    assert_eq!(rows[0]["scored_tokens"], chunks * 255);

    let svg = std::fs::read_to_string(&svg).unwrap();
    check_svg(&svg);
    check_labels(&svg, &["Q8_0", "Q4_K_M", "Q2_K"], 2);
    for text in [
        "bits per weight",
        "perplexity",
        "KL divergence",
        "quantized",
    ] {
        assert!(svg.contains(text), "{text} missing from the plot");
    }
    // the two F32 files are reference lines, in the legend with their perplexity
    let legend = texts(&svg)
        .into_iter()
        .filter(|t| t.text.contains("F32") && t.text.contains(": 4"))
        .count();
    assert_eq!(legend, 2, "{svg}");

    // llama-perplexity's --kl-divergence-base layout: header, tokens, u16 log-probs per scored position.
    let n_vocab: usize = 4160;
    let nv = 2 * n_vocab.div_ceil(2) + 4;
    let expect = 8 + 3 * 4 + chunks * 512 * 4 + chunks * 255 * nv * 2;
    let saved = std::fs::read(&logits).unwrap();
    assert_eq!(saved.len(), expect);
    assert_eq!(&saved[..8], b"_logits_");
}

/// `--quantize-from` with `--imatrix`: every type with and without the matrix, the ones that need it
/// with it only; the JSON, table labels and plot mark the imatrix files.
#[test]
fn quantize_from_with_imatrix_makes_both_variants() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("plot.svg");
    let out = deltaq(&[
        "--quantize-from",
        &repo("tests/fixtures/shared/tiny-r2/tiny-r2-F32.gguf")
            .display()
            .to_string(),
        "--types",
        "q4_k_m,iq2_xxs",
        "--imatrix",
        &repo("tests/fixtures/imatrix/tiny-r2.imatrix.gguf")
            .display()
            .to_string(),
        "-f",
        &eval_text().display().to_string(),
        "-c",
        "128",
        "--chunks",
        "2",
        "--json",
        "--plot",
        &svg.display().to_string(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let got: Vec<(String, bool)> = rows
        .iter()
        .map(|r| {
            let file = r["file"].as_str().unwrap();
            let name = Path::new(file)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (name, r["imatrix"].as_bool().unwrap())
        })
        .collect();
    let want = [
        ("tiny-r2-F32.gguf", false),
        ("tiny-r2-Q4_K_M.gguf", false),
        ("tiny-r2-Q4_K_M-imatrix.gguf", true),
        ("tiny-r2-IQ2_XXS-imatrix.gguf", true),
    ];
    let mut got_sorted = got.clone();
    got_sorted.sort();
    let mut want_sorted: Vec<(String, bool)> =
        want.iter().map(|(n, i)| (n.to_string(), *i)).collect();
    want_sorted.sort();
    assert_eq!(got_sorted, want_sorted);
    // The matrix helps: at 4.9 bits it lowers the KL divergence from F32 on this model.
    let kl = |name: &str| {
        rows.iter()
            .find(|r| r["file"].as_str().unwrap().ends_with(name))
            .and_then(|r| r["kl_mean"].as_f64())
            .unwrap()
    };
    assert!(kl("-Q4_K_M-imatrix.gguf") < kl("-Q4_K_M.gguf"));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.contains("Q4_K_M imatrix") && svg.contains("IQ2_XXS imatrix"),
        "labels in the plot"
    );
}

#[test]
fn errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let model = repo("models/tiny-kjv-mtp-Q8_0.gguf");
    let m = model.to_str().unwrap();
    let run = |text: &[u8], extra: &[&str]| {
        let p = dir.path().join("text.txt");
        std::fs::write(&p, text).unwrap();
        let mut args = vec!["-m", m, "-f", p.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = deltaq(&args);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(b"", &[]);
    assert!(e.contains("is empty"), "{e}");
    let e = run(b"In the beginning \xe9tait le Verbe", &[]);
    assert!(e.contains("not UTF-8") && e.contains("offset 17"), "{e}");
    let e = run("In the beginning was the Word. ".repeat(40).as_bytes(), &[]);
    assert!(
        e.contains("needs at least 1024 tokens") && e.contains("context of 512"),
        "{e}"
    );
    // Another vocabulary (tiny-r1 has 1,280 tokens) cannot be compared token for token.
    let r1 = repo("tests/fixtures/shared/tiny-r1/tiny-r1-F32.gguf");
    if r1.exists() {
        let e = run(
            b"And the Word was made flesh.",
            &["-m", r1.to_str().unwrap()],
        );
        assert!(e.contains("different vocabularies"), "{e}");
    }
    let e = run(b"text", &["--sweep", dir.path().to_str().unwrap()]);
    assert!(e.contains("no .gguf file"), "{e}");
}
