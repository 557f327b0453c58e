//! `deltaq convert` against llama.cpp's `convert_hf_to_gguf.py`: the fixture checkpoints must convert to
//! byte-identical files (tiny-r1: tied, Hv = Hk; tiny-r2: untied, Hv = 2 Hk), also when the checkpoint
//! is sharded and nested like `Qwen3_5ForConditionalGeneration`; quantized outtypes must equal
//! `deltaq quantize` of the F32 conversion; broken checkpoints must fail clearly and leave no output.
//! Fixtures are copied by tools/fetch-fixtures.sh.

use std::path::{Path, PathBuf};

use deltaq::convert::safetensors::Checkpoint;
use deltaq::convert::{convert, ConvertOptions};
use deltaq::gguf::GgufFile;
use deltaq::quantize::{quantize_file, FileType, QuantizeOptions};
use serde_json::{json, Value};

fn shared(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/shared")
        .join(rel);
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-fixtures.sh",
        p.display()
    );
    p
}

fn opts(outtype: FileType, name: &str) -> ConvertOptions {
    ConvertOptions {
        outtype,
        no_mtp: true,
        model_name: Some(name.to_string()),
        overwrite: false,
        progress: false,
    }
}

/// Asserts two GGUF files are identical, naming the first difference if not.
fn assert_same_file(ours: &Path, theirs: &Path) {
    let (a, b) = (std::fs::read(ours).unwrap(), std::fs::read(theirs).unwrap());
    if a == b {
        return;
    }
    let (fa, fb) = (
        GgufFile::open(ours).unwrap(),
        GgufFile::open(theirs).unwrap(),
    );
    let ka: Vec<&str> = fa.keys().collect();
    let kb: Vec<&str> = fb.keys().collect();
    assert_eq!(ka, kb, "metadata keys or their order differ");
    for k in &ka {
        assert_eq!(
            fa.get(k).unwrap().to_owned_value(),
            fb.get(k).unwrap().to_owned_value(),
            "metadata {k} differs"
        );
    }
    let ta: Vec<_> = fa
        .tensors()
        .iter()
        .map(|t| (&t.name, t.ty, &t.ne))
        .collect();
    let tb: Vec<_> = fb
        .tensors()
        .iter()
        .map(|t| (&t.name, t.ty, &t.ne))
        .collect();
    assert_eq!(ta, tb, "tensor names, order, types or shapes differ");
    for t in fb.tensors() {
        assert!(
            fa.tensor_by_name(&t.name).unwrap().1 == fb.tensor_data(t),
            "data of {} differs",
            t.name
        );
    }
    panic!("{} and {} differ", ours.display(), theirs.display());
}

fn check_identical(model: &str, outtype: FileType) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    convert(&shared(&format!("{model}/hf")), &out, &opts(outtype, model)).unwrap();
    assert_same_file(&out, &shared(&format!("{model}/{model}-{outtype}.gguf")));
}

#[test]
fn tiny_r1_f32_is_byte_identical() {
    check_identical("tiny-r1", FileType::F32);
}

#[test]
fn tiny_r1_f16_is_byte_identical() {
    check_identical("tiny-r1", FileType::F16);
}

#[test]
fn tiny_r2_f32_is_byte_identical() {
    check_identical("tiny-r2", FileType::F32);
}

#[test]
fn tiny_r2_f16_is_byte_identical() {
    check_identical("tiny-r2", FileType::F16);
}

#[test]
fn q4_k_m_equals_quantize_of_the_f32_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let hf = shared("tiny-r2/hf");
    let f32 = dir.path().join("f32.gguf");
    convert(&hf, &f32, &opts(FileType::F32, "tiny-r2")).unwrap();
    let direct = dir.path().join("direct.gguf");
    convert(&hf, &direct, &opts(FileType::Q4_K_M, "tiny-r2")).unwrap();
    let two_step = dir.path().join("two-step.gguf");
    let q = QuantizeOptions {
        ftype: FileType::Q4_K_M,
        pure: false,
        keep: vec![],
        overwrite: false,
        progress: false,
        imatrix: None,
        token_embedding_type: None,
        output_tensor_type: None,
        tensor_types: Vec::new(),
    };
    quantize_file(&f32, &two_step, &q).unwrap();
    assert_same_file(&direct, &two_step);
}

#[test]
fn q8_0_follows_the_converter_rules() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q8.gguf");
    convert(
        &shared("tiny-r2/hf"),
        &out,
        &opts(FileType::Q8_0, "tiny-r2"),
    )
    .unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.get_u64("general.file_type").unwrap(), 7);
    let reference = GgufFile::open(shared("tiny-r2/tiny-r2-F16.gguf")).unwrap();
    // Same tensors in the same order; Q8_0 wherever the converter's F16 file has F16.
    assert_eq!(f.tensors().len(), reference.tensors().len());
    for (a, b) in f.tensors().iter().zip(reference.tensors()) {
        assert_eq!(a.name, b.name);
        let want = match b.ty {
            deltaq::quant::GgmlType::F16 => deltaq::quant::GgmlType::Q8_0,
            t => t,
        };
        assert_eq!(a.ty, want, "{}", a.name);
    }
}

// ---- building checkpoints --------------------------------------------------------------------------

/// The tensors of a fixture checkpoint: (name, dtype, shape, bytes), sorted by name.
fn read_tensors(hf: &Path) -> Vec<(String, String, Vec<u64>, Vec<u8>)> {
    let ck = Checkpoint::open(hf).unwrap();
    ck.tensors
        .iter()
        .map(|t| {
            let data = ck.map(t, 0, t.nbytes).unwrap().to_vec();
            (t.name.clone(), t.dtype_name.clone(), t.shape.clone(), data)
        })
        .collect()
}

fn write_safetensors(path: &Path, tensors: &[(String, String, Vec<u64>, Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.len() as u64]}),
        );
        offset += data.len() as u64;
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    std::fs::write(path, out).unwrap();
}

fn copy_small_files(from: &Path, to: &Path) {
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
}

fn read_config(dir: &Path) -> serde_json::Map<String, Value> {
    serde_json::from_str::<Value>(&std::fs::read_to_string(dir.join("config.json")).unwrap())
        .unwrap()
        .as_object()
        .unwrap()
        .clone()
}

fn write_config(dir: &Path, cfg: &serde_json::Map<String, Value>) {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(cfg).unwrap(),
    )
    .unwrap();
}

/// tiny-r2 as a `Qwen3_5ForConditionalGeneration` checkpoint: text config nested, tensors renamed to
/// `model.language_model.*`, a vision tensor, two shards with an index.
fn nested_sharded_r2(dir: &Path) {
    let src = shared("tiny-r2/hf");
    copy_small_files(&src, dir);
    let text = read_config(&src);
    let mut top = serde_json::Map::new();
    top.insert(
        "architectures".into(),
        json!(["Qwen3_5ForConditionalGeneration"]),
    );
    top.insert("model_type".into(), json!("qwen3_5"));
    top.insert(
        "vision_config".into(),
        json!({"depth": 1, "hidden_size": 16}),
    );
    let mut text = text.clone();
    text.remove("architectures");
    top.insert("text_config".into(), Value::Object(text));
    write_config(dir, &top);

    let mut tensors: Vec<_> = read_tensors(&src)
        .into_iter()
        .map(|(n, d, s, b)| {
            let n = n.replacen("model.", "model.language_model.", 1);
            (n, d, s, b)
        })
        .collect();
    tensors.push((
        "model.visual.patch_embed.proj.weight".into(),
        "F32".into(),
        vec![4, 4],
        vec![0u8; 64],
    ));
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    // Split in name order so that the converter's order (shard by shard, names sorted) is unchanged.
    let cut = tensors.len() / 2;
    let (a, b) = tensors.split_at(cut);
    write_safetensors(&dir.join("model-00001-of-00002.safetensors"), a);
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), b);
    let mut map = serde_json::Map::new();
    for (t, file) in a
        .iter()
        .map(|t| (t, "model-00001-of-00002.safetensors"))
        .chain(b.iter().map(|t| (t, "model-00002-of-00002.safetensors")))
    {
        map.insert(t.0.clone(), json!(file));
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_string(&json!({"metadata": {}, "weight_map": map})).unwrap(),
    )
    .unwrap();
}

#[test]
fn nested_sharded_checkpoint_converts_identically() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    nested_sharded_r2(&hf);
    let out = dir.path().join("out.gguf");
    let s = convert(&hf, &out, &opts(FileType::F32, "tiny-r2")).unwrap();
    assert_eq!(s.skipped_vision, 1);
    assert_same_file(&out, &shared("tiny-r2/tiny-r2-F32.gguf"));
}

/// tiny-r1 with a synthetic MTP block (a copy of layer 3 plus fc and three norms).
fn r1_with_mtp(dir: &Path) {
    let src = shared("tiny-r1/hf");
    copy_small_files(&src, dir);
    let mut cfg = read_config(&src);
    cfg.insert("mtp_num_hidden_layers".into(), json!(1));
    write_config(dir, &cfg);
    let mut tensors = read_tensors(&src);
    let layer3: Vec<_> = tensors
        .iter()
        .filter(|t| t.0.starts_with("model.layers.3."))
        .map(|(n, d, s, b)| {
            (
                n.replace("model.layers.3.", "mtp.layers.0."),
                d.clone(),
                s.clone(),
                b.clone(),
            )
        })
        .collect();
    tensors.extend(layer3);
    let norm = |name: &str, v: f32| {
        let b: Vec<u8> = (0..256).flat_map(|_| v.to_le_bytes()).collect();
        (name.to_string(), "F32".to_string(), vec![256u64], b)
    };
    tensors.push(norm("mtp.pre_fc_norm_embedding.weight", 0.5));
    tensors.push(norm("mtp.pre_fc_norm_hidden.weight", 0.25));
    tensors.push(norm("mtp.norm.weight", -0.5));
    tensors.push((
        "mtp.fc.weight".into(),
        "F32".into(),
        vec![256, 512],
        vec![0u8; 256 * 512 * 4],
    ));
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

#[test]
fn mtp_block_is_kept_by_default_and_dropped_with_no_mtp() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    r1_with_mtp(&hf);

    let dropped = dir.path().join("no-mtp.gguf");
    let s = convert(&hf, &dropped, &opts(FileType::F32, "tiny-r1")).unwrap();
    assert_eq!(s.dropped_mtp, 15);
    assert_same_file(&dropped, &shared("tiny-r1/tiny-r1-F32.gguf"));

    let kept = dir.path().join("mtp.gguf");
    let mut o = opts(FileType::F32, "tiny-r1");
    o.no_mtp = false;
    convert(&hf, &kept, &o).unwrap();
    let f = GgufFile::open(&kept).unwrap();
    assert_eq!(f.get_u64("qwen35.block_count").unwrap(), 5);
    assert_eq!(f.get_u64("qwen35.nextn_predict_layers").unwrap(), 1);
    let rec = f.get_array("qwen35.attention.recurrent_layers").unwrap();
    assert_eq!(rec.len, 5);
    let keys: Vec<&str> = f.keys().collect();
    let pos = |k: &str| keys.iter().position(|x| *x == k).unwrap();
    assert!(pos("general.file_type") < pos("qwen35.nextn_predict_layers"));
    assert!(pos("qwen35.nextn_predict_layers") < pos("qwen35.ssm.conv_kernel"));
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    // MTP tensors come last (the "mtp." names sort after "model.").
    assert_eq!(names.len(), 55 + 15);
    assert!(
        names[55..].iter().all(|n| n.starts_with("blk.4.")),
        "{names:?}"
    );
    for n in [
        "blk.4.nextn.eh_proj.weight",
        "blk.4.nextn.enorm.weight",
        "blk.4.nextn.hnorm.weight",
        "blk.4.nextn.shared_head_norm.weight",
        "blk.4.attn_q.weight",
        "blk.4.attn_q_norm.weight",
    ] {
        assert!(names.contains(&n), "{n} missing");
    }
    let val = |n: &str| {
        let (_, d) = f.tensor_by_name(n).unwrap();
        f32::from_le_bytes(d[..4].try_into().unwrap())
    };
    assert_eq!(val("blk.4.nextn.enorm.weight"), 1.5);
    assert_eq!(val("blk.4.nextn.hnorm.weight"), 1.25);
    assert_eq!(val("blk.4.nextn.shared_head_norm.weight"), 0.5);
    // the copied attention layer is converted like layer 3
    let (_, a) = f.tensor_by_name("blk.4.attn_q_norm.weight").unwrap();
    let (_, b) = f.tensor_by_name("blk.3.attn_q_norm.weight").unwrap();
    assert_eq!(a, b);
}

// ---- errors --------------------------------------------------------------------------------------

/// Converts and expects an error mentioning `needle`; the output must not exist afterwards.
fn expect_error(hf: &Path, needle: &str) {
    let out = hf.parent().unwrap().join("out.gguf");
    let err = match convert(hf, &out, &opts(FileType::F16, "x")) {
        Ok(_) => panic!("converting {} should fail", hf.display()),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains(needle),
        "error {err:?} does not mention {needle:?}"
    );
    assert!(!out.exists(), "a failed conversion left {}", out.display());
    let leftovers: Vec<_> = std::fs::read_dir(hf.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left behind");
}

fn r1_copy(dir: &Path) -> PathBuf {
    let hf = dir.join("hf");
    std::fs::create_dir(&hf).unwrap();
    copy_small_files(&shared("tiny-r1/hf"), &hf);
    std::fs::copy(
        shared("tiny-r1/hf/model.safetensors"),
        hf.join("model.safetensors"),
    )
    .unwrap();
    hf
}

#[test]
fn missing_config_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = r1_copy(dir.path());
    std::fs::remove_file(hf.join("config.json")).unwrap();
    expect_error(&hf, "no config.json");
}

#[test]
fn unknown_architecture_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = r1_copy(dir.path());
    let mut cfg = read_config(&hf);
    cfg.insert("architectures".into(), json!(["LlamaForCausalLM"]));
    write_config(&hf, &cfg);
    expect_error(&hf, "unknown architecture LlamaForCausalLM");
}

#[test]
fn truncated_safetensors_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = r1_copy(dir.path());
    let p = hf.join("model.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 1000).unwrap();
    expect_error(&hf, "truncated safetensors file");
}

#[test]
fn missing_shard_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    nested_sharded_r2(&hf);
    std::fs::remove_file(hf.join("model-00002-of-00002.safetensors")).unwrap();
    expect_error(&hf, "missing shard(s)");
}

#[test]
fn tensor_missing_from_its_shard_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    nested_sharded_r2(&hf);
    let p = hf.join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    index["weight_map"]["model.language_model.layers.9.mlp.up_proj.weight"] =
        json!("model-00002-of-00002.safetensors");
    std::fs::write(&p, serde_json::to_string(&index).unwrap()).unwrap();
    expect_error(&hf, "'model.language_model.layers.9.mlp.up_proj.weight'");
}

#[test]
fn unsupported_dtype_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    copy_small_files(&shared("tiny-r1/hf"), &hf);
    let tensors: Vec<_> = read_tensors(&shared("tiny-r1/hf"))
        .into_iter()
        .map(|(n, d, s, b)| {
            if n == "model.norm.weight" {
                (n, "I32".to_string(), s, b)
            } else {
                (n, d, s, b)
            }
        })
        .collect();
    write_safetensors(&hf.join("model.safetensors"), &tensors);
    expect_error(&hf, "dtype I32");
}

#[test]
fn shape_mismatch_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = r1_copy(dir.path());
    let mut cfg = read_config(&hf);
    cfg.insert("intermediate_size".into(), json!(768));
    write_config(&hf, &cfg);
    expect_error(&hf, "config.json implies");
}

#[test]
fn existing_output_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    std::fs::write(&out, b"keep me").unwrap();
    let hf = shared("tiny-r1/hf");
    let err = convert(&hf, &out, &opts(FileType::F32, "tiny-r1")).unwrap_err();
    assert!(format!("{err:#}").contains("already exists"), "{err:#}");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    let mut o = opts(FileType::F32, "tiny-r1");
    o.overwrite = true;
    convert(&hf, &out, &o).unwrap();
    assert_same_file(&out, &shared("tiny-r1/tiny-r1-F32.gguf"));
}
