//! `deltaq quantize --imatrix` against `llama-quantize --imatrix`: tiny-r2's F32 file with llama-imatrix's
//! matrix (tests/fixtures/imatrix), every pure type and every ftype recipe. The references are per-tensor
//! name, type and SHA-256 of the data (tests/fixtures/imatrix/quant/*.tsv, from
//! tools/make-imatrix-vectors.sh). For the IQ ftypes, whose quantizers are not here yet, the tensor types.

use std::path::{Path, PathBuf};

use deltaq::gguf::GgufFile;
use deltaq::quant::GgmlType;
use deltaq::quantize::{
    quantize_file, FileType, Imatrix, ImatrixOptions, QuantizeOptions, TensorTypeOverride,
};
use sha2::{Digest, Sha256};

fn root(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn model() -> PathBuf {
    let p = root("tests/fixtures/shared/tiny-r2/tiny-r2-F32.gguf");
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-fixtures.sh",
        p.display()
    );
    p
}

fn imatrix_gguf() -> PathBuf {
    root("tests/fixtures/imatrix/tiny-r2.imatrix.gguf")
}

/// (name, type, sha256) per tensor, in file order.
fn reference(name: &str) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(root(&format!("tests/fixtures/imatrix/quant/{name}.tsv")))
        .unwrap_or_else(|e| panic!("{name}.tsv: {e}"));
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 3, "{name}.tsv: {l}");
            (f[0].to_string(), f[1].to_string(), f[2].to_string())
        })
        .collect()
}

/// The options tools/make-imatrix-vectors.sh gives llama-quantize for a reference name.
/// The `--tensor-type` arguments of the tt-<FTYPE> references (as in tools/make-imatrix-vectors.sh).
fn tensor_type_args(name: &str) -> &'static [&'static str] {
    match name {
        "tt-Q4_K_M" => &[r"blk\.1\.ffn_down=q8_0", "attn_(k|q)=q5_K", "attn_k=q4_0"],
        "tt-IQ2_M" => &[r"blk\.1\.=q4_K", "FFN_UP=iq3_s"],
        _ => &[],
    }
}

fn options(name: &str, imatrix: &Path) -> QuantizeOptions {
    let pure = name.starts_with("pure-");
    let base = name.trim_start_matches("pure-").trim_start_matches("tt-");
    let ftype = match name {
        "pure-Q3_K" => "Q3_K_M",
        "pure-Q4_K" => "Q4_K_M",
        "pure-Q5_K" => "Q5_K_M",
        "pure-IQ2_S" => "IQ2_M",
        _ => base,
    };
    let low_bit = pure && (base.starts_with("IQ2_") || base.starts_with("IQ1_"));
    QuantizeOptions {
        ftype: FileType::from_name(ftype).unwrap_or_else(|| panic!("ftype {ftype}")),
        pure,
        keep: vec![],
        overwrite: false,
        progress: false,
        imatrix: Some(ImatrixOptions {
            path: imatrix.to_path_buf(),
            include: vec![],
            exclude: vec![],
        }),
        token_embedding_type: low_bit.then_some(GgmlType::Q4_K),
        output_tensor_type: low_bit.then_some(GgmlType::Q4_K),
        tensor_types: tensor_type_args(name)
            .iter()
            .map(|a| TensorTypeOverride::parse(a).unwrap())
            .collect(),
    }
}

fn digests(path: &Path) -> Vec<(String, String, String)> {
    let f = GgufFile::open(path).unwrap();
    f.tensors()
        .iter()
        .map(|t| {
            let hash = Sha256::digest(f.tensor_data(t));
            let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
            (t.name.clone(), t.ty.name().to_string(), hex)
        })
        .collect()
}

/// Quantizes as the reference was made and compares every tensor's name, type and data digest.
fn check_data(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    quantize_file(&model(), &out, &options(name, &imatrix_gguf())).unwrap();
    let ours = digests(&out);
    let theirs = reference(name);
    let names = |v: &[(String, String, String)]| {
        v.iter()
            .map(|(n, t, _)| format!("{n} {t}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&ours),
        names(&theirs),
        "{name}: tensors or types differ"
    );
    let differing: Vec<&str> = ours
        .iter()
        .zip(&theirs)
        .filter(|(a, b)| a.2 != b.2)
        .map(|(a, _)| a.0.as_str())
        .collect();
    assert!(
        differing.is_empty(),
        "{name}: data of {} of {} tensors differs: {differing:?}",
        differing.len(),
        ours.len()
    );
}

macro_rules! data_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(#[test]
        fn $test() {
            check_data($name);
        })*
    };
}

data_tests! {
    pure_q4_0 => "pure-Q4_0",
    pure_q4_1 => "pure-Q4_1",
    pure_q5_0 => "pure-Q5_0",
    pure_q5_1 => "pure-Q5_1",
    pure_q8_0 => "pure-Q8_0",
    pure_q2_k => "pure-Q2_K",
    pure_q3_k => "pure-Q3_K",
    pure_q4_k => "pure-Q4_K",
    pure_q5_k => "pure-Q5_K",
    pure_q6_k => "pure-Q6_K",
    ftype_q2_k => "Q2_K",
    ftype_q2_k_s => "Q2_K_S",
    ftype_q3_k_s => "Q3_K_S",
    ftype_q3_k_m => "Q3_K_M",
    ftype_q3_k_l => "Q3_K_L",
    ftype_q4_k_s => "Q4_K_S",
    ftype_q4_k_m => "Q4_K_M",
    ftype_q5_k_s => "Q5_K_S",
    ftype_q5_k_m => "Q5_K_M",
    ftype_q6_k => "Q6_K",
    ftype_iq4_nl => "IQ4_NL",
    ftype_iq4_xs => "IQ4_XS",
    ftype_iq3_xs => "IQ3_XS",
    ftype_iq3_s => "IQ3_S",
    ftype_iq3_m => "IQ3_M",
    pure_iq4_nl => "pure-IQ4_NL",
    pure_iq4_xs => "pure-IQ4_XS",
    pure_iq3_xxs => "pure-IQ3_XXS",
    pure_iq3_s => "pure-IQ3_S",
    ftype_iq3_xxs => "IQ3_XXS",
    ftype_iq2_xxs => "IQ2_XXS",
    ftype_iq2_xs => "IQ2_XS",
    ftype_iq2_s => "IQ2_S",
    ftype_iq2_m => "IQ2_M",
    ftype_iq1_s => "IQ1_S",
    ftype_iq1_m => "IQ1_M",
    pure_iq2_xxs => "pure-IQ2_XXS",
    pure_iq2_xs => "pure-IQ2_XS",
    pure_iq2_s => "pure-IQ2_S",
    pure_iq1_s => "pure-IQ1_S",
    pure_iq1_m => "pure-IQ1_M",
    tensor_type_q4_k_m => "tt-Q4_K_M",
    tensor_type_iq2_m => "tt-IQ2_M",
}

/// The same matrix as a legacy .dat file gives the same file (llama-quantize agrees: see
/// docs/quantize-imatrix.md) apart from the metadata naming the file.
#[test]
fn dat_input_gives_the_same_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    let dat = root("tests/fixtures/imatrix/tiny-r2.imatrix.dat");
    quantize_file(&model(), &a, &options("Q4_K_M", &imatrix_gguf())).unwrap();
    quantize_file(&model(), &b, &options("Q4_K_M", &dat)).unwrap();
    assert_eq!(digests(&a), digests(&b));
    let (fa, fb) = (GgufFile::open(&a).unwrap(), GgufFile::open(&b).unwrap());
    for key in [
        "quantize.imatrix.dataset",
        "quantize.imatrix.entries_count",
        "quantize.imatrix.chunks_count",
    ] {
        assert_eq!(
            fa.get(key).map(|v| v.to_owned_value()),
            fb.get(key).map(|v| v.to_owned_value()),
            "{key}"
        );
    }
}

/// llama-quantize's metadata: after general.file_type, file, dataset, entries and chunks, in this order.
#[test]
fn imatrix_metadata_as_llama_quantize_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q.gguf");
    quantize_file(&model(), &out, &options("Q4_K_M", &imatrix_gguf())).unwrap();
    let f = GgufFile::open(&out).unwrap();
    let keys: Vec<&str> = f.keys().collect();
    let tail = &keys[keys.len() - 6..];
    assert_eq!(
        tail,
        [
            "general.quantization_version",
            "general.file_type",
            "quantize.imatrix.file",
            "quantize.imatrix.dataset",
            "quantize.imatrix.entries_count",
            "quantize.imatrix.chunks_count"
        ]
    );
    assert_eq!(
        f.get_str("quantize.imatrix.file").unwrap(),
        imatrix_gguf().to_string_lossy()
    );
    assert_eq!(
        f.get_str("quantize.imatrix.dataset").unwrap(),
        "eval-john.txt"
    );
    assert_eq!(f.get_u64("quantize.imatrix.entries_count").unwrap(), 62);
    assert_eq!(f.get_u64("quantize.imatrix.chunks_count").unwrap(), 8);
}

#[test]
fn both_formats_load_to_the_same_weights() {
    let g = Imatrix::load(&imatrix_gguf()).unwrap();
    let d = Imatrix::load(&root("tests/fixtures/imatrix/tiny-r2.imatrix.dat")).unwrap();
    assert_eq!(g.entries.len(), 62);
    // in_sum2/count and (average·ncall)/ncall agree to the bit on this matrix.
    assert_eq!(g.entries, d.entries);
    assert_eq!((g.chunk_count, d.chunk_count), (8, 8));
    assert_eq!(g.datasets, d.datasets);
}

fn err_of(opts: &QuantizeOptions) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let e = quantize_file(&model(), &out, opts).unwrap_err();
    assert!(!out.exists(), "no output after an error");
    format!("{e:#}")
}

#[test]
fn refuses_low_bit_ftypes_without_imatrix() {
    for (ftype, ty) in [
        ("Q2_K_S", "Q2_K"),
        ("IQ2_XXS", "IQ2_XXS"),
        ("IQ1_S", "IQ1_S"),
        ("IQ3_XXS", "IQ3_XXS"),
    ] {
        let mut opts = options(ftype, &imatrix_gguf());
        opts.imatrix = None;
        let e = err_of(&opts);
        assert!(
            e.contains("requires an importance matrix") && e.contains(ty),
            "{ftype}: {e}"
        );
    }
    // Q2_K itself does not need one.
    let mut opts = options("Q2_K", &imatrix_gguf());
    opts.imatrix = None;
    let dir = tempfile::tempdir().unwrap();
    quantize_file(&model(), &dir.path().join("q.gguf"), &opts).unwrap();
}

#[test]
fn missing_weights_for_a_low_bit_tensor_is_an_error() {
    let mut opts = options("Q2_K_S", &imatrix_gguf());
    opts.imatrix.as_mut().unwrap().exclude = vec!["ffn_up".into()];
    let e = err_of(&opts);
    assert!(
        e.contains("missing importance matrix") && e.contains("ffn_up"),
        "{e}"
    );
}

#[test]
fn malformed_imatrix_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(imatrix_gguf()).unwrap();
    let dat = std::fs::read(root("tests/fixtures/imatrix/tiny-r2.imatrix.dat")).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("truncated gguf", good[..good.len() / 2].to_vec()),
        ("truncated gguf header", good[..40].to_vec()),
        ("truncated dat", dat[..dat.len() / 2].to_vec()),
        ("dat without entries", 0i32.to_le_bytes().to_vec()),
    ];
    for (what, bytes) in cases {
        let p = dir.path().join("bad.imatrix");
        std::fs::write(&p, &bytes).unwrap();
        let e = err_of(&options("Q4_K_M", &p));
        assert!(e.contains("imatrix"), "{what}: {e}");
    }
    let mut opts = options("Q4_K_M", &dir.path().join("does-not-exist.gguf"));
    assert!(err_of(&opts).contains("does-not-exist"));
    opts.imatrix = Some(ImatrixOptions {
        path: imatrix_gguf(),
        include: vec!["a".into()],
        exclude: vec!["b".into()],
    });
    assert!(err_of(&opts).contains("cannot be used together"));
}

/// A GGUF imatrix with a `.in_sum2` and no `.counts`, one of the wrong size, and one without the
/// imatrix metadata: clear errors.
#[test]
fn inconsistent_gguf_imatrix_files_are_errors() {
    use deltaq::gguf::{GgufWriter, OwnedValue, TensorSpec};
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, meta: bool, tensors: &[(&str, Vec<f32>)]| -> PathBuf {
        let mut w = GgufWriter::new();
        w.set("general.type", OwnedValue::str("imatrix"));
        if meta {
            w.set("imatrix.datasets", OwnedValue::strings(&["d.txt"]));
            w.set("imatrix.chunk_count", OwnedValue::U32(1));
            w.set("imatrix.chunk_size", OwnedValue::U32(128));
        }
        for (n, v) in tensors {
            w.add_tensor(TensorSpec::new(*n, GgmlType::F32, &[v.len() as u64]))
                .unwrap();
        }
        let p = dir.path().join(name);
        w.write_to_path(&p, true, |i, _, out| -> anyhow::Result<()> {
            for x in &tensors[i].1 {
                out.write_all(&x.to_le_bytes())?;
            }
            Ok(())
        })
        .unwrap();
        p
    };
    let name = "blk.0.ffn_up.weight";
    let sums = format!("{name}.in_sum2");
    let counts = format!("{name}.counts");
    let no_counts = write("a.gguf", true, &[(sums.as_str(), vec![1.0; 256])]);
    let e = err_of(&options("Q4_K_M", &no_counts));
    assert!(e.contains("mismatched sums and counts"), "{e}");
    let no_meta = write(
        "b.gguf",
        false,
        &[
            (sums.as_str(), vec![1.0; 256]),
            (counts.as_str(), vec![4.0]),
        ],
    );
    let e = err_of(&options("Q4_K_M", &no_meta));
    assert!(e.contains("missing imatrix metadata"), "{e}");
    let bad_split = write(
        "c.gguf",
        true,
        &[
            (sums.as_str(), vec![1.0; 255]),
            (counts.as_str(), vec![4.0, 4.0]),
        ],
    );
    let e = err_of(&options("Q4_K_M", &bad_split));
    assert!(e.contains("experts"), "{e}");
    let wrong_size = write(
        "d.gguf",
        true,
        &[
            (sums.as_str(), vec![1.0; 128]),
            (counts.as_str(), vec![4.0]),
        ],
    );
    let e = err_of(&options("Q4_K_M", &wrong_size));
    assert!(e.contains("different from tensor size"), "{e}");
    let non_finite = write(
        "e.gguf",
        true,
        &[
            (sums.as_str(), vec![f32::INFINITY; 256]),
            (counts.as_str(), vec![4.0]),
        ],
    );
    let e = err_of(&options("Q4_K_M", &non_finite));
    assert!(e.contains("non-finite"), "{e}");
}

/// A file with a multi-token-prediction block (the demo model): importance matrices never cover that
/// block, so the 2-bit types refuse it with a message that names the block and the ways out:
/// `--tensor-type 'blk\.N\.=q4_K'` (that block in Q4_K) and `--keep-f32 'blk.N.'` make the file.
#[test]
fn mtp_block_without_weights_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let demo = root("models/tiny-kjv-mtp-Q8_0.gguf");
    let imx = dir.path().join("demo.imatrix.gguf");
    let text = root("eval/eval-john.txt");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_deltaq"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[
        "imatrix",
        "-m",
        demo.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        "128",
        "--chunks",
        "4",
        "--no-ppl",
        "-o",
        imx.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let q = dir.path().join("q.gguf");
    let quantize = |extra: &[&str]| {
        let mut args = vec!["quantize", "--imatrix", imx.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.extend([demo.to_str().unwrap(), q.to_str().unwrap(), "IQ2_XXS"]);
        run(&args)
    };
    let out = quantize(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("blk.8.")
            && err.contains("multi-token-prediction")
            && err.contains("--keep-f32 'blk.8.'")
            && err.contains(r"--tensor-type 'blk\.8\.=q4_K'"),
        "{err}"
    );
    assert!(!q.exists(), "no partial output is left behind");
    let out = quantize(&["--tensor-type", r"blk\.8\.=q4_K"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = GgufFile::open(&q).unwrap();
    let types = |prefix: &str| -> Vec<String> {
        f.tensors()
            .iter()
            .filter(|t| t.name.starts_with(prefix) && t.ne.len() == 2 && t.ne[1] > 1)
            .map(|t| t.ty.name().to_string())
            .collect()
    };
    assert!(
        types("blk.8.").iter().all(|t| t == "Q4_K"),
        "{:?}",
        types("blk.8.")
    );
    assert!(types("blk.0.").iter().any(|t| t == "IQ2_XXS"));
    drop(f);
    std::fs::remove_file(&q).unwrap();
    let out = quantize(&["--keep-f32", "blk.8."]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = GgufFile::open(&q).unwrap();
    assert!(f
        .tensors()
        .iter()
        .any(|t| t.name.starts_with("blk.0.") && t.ty.name() == "IQ2_XXS"));
}

/// Files quantized to the IQ types (tiny-r2 with llama-imatrix's matrix) give the same logits, bit for
/// bit, for the 48 golden tokens in one batch (prefill: the IQ GEMM where the table has one, for 16 or
/// more tokens) and one token at a time (decode kernels). Together the recipes cover IQ4_XS, IQ3_S,
/// IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_S and IQ1_M.
#[test]
fn iq_files_prefill_equals_decode() {
    use deltaq::model::{DeltaMode, Model, Session};
    let tokens: Vec<u32> =
        deltaq::npy::read(&root("tests/fixtures/shared/tiny-r2/golden/tokens.npy"))
            .unwrap()
            .data
            .iter()
            .map(|&t| t as u32)
            .collect();
    assert!(tokens.len() >= 32);
    for name in ["IQ4_XS", "IQ2_M", "IQ3_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("q.gguf");
        quantize_file(&model(), &out, &options(name, &imatrix_gguf())).unwrap();
        let f = GgufFile::open(&out).unwrap();
        let m = Model::load(&f).unwrap();
        // The recurrent delta rule in the batch, as token by token (the chunked form differs by rounding).
        let mut rec = Session::new(&m, None);
        rec.delta_mode = DeltaMode::Recurrent;
        let batch = rec.forward(&tokens).unwrap();
        let mut st = Session::new(&m, None);
        let step: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| st.forward(&[t]).unwrap())
            .collect();
        assert_eq!(batch.len(), step.len());
        let differing = batch
            .iter()
            .zip(&step)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differing, 0, "{name}: batch vs token by token");
    }
}
