//! `deltaq convert` on a vision-language checkpoint (tiny-v1, `Qwen3_5ForConditionalGeneration`) against
//! llama.cpp's `convert_hf_to_gguf.py`: `--mmproj` must write byte-identical mmproj files (F32, F16), the
//! BF16 and Q8_0 ones must follow the converter's type rules, the text conversion must be byte-identical
//! too, and broken checkpoints must fail clearly without leaving an output or touching the input.
//! Fixtures are copied by tools/fetch-fixtures.sh.

use std::path::{Path, PathBuf};

use deltaq::convert::safetensors::Checkpoint;
use deltaq::convert::{convert, convert_mmproj, ConvertOptions};
use deltaq::gguf::GgufFile;
use deltaq::quant::{quantize_row, GgmlType};
use deltaq::quantize::FileType;
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

fn opts(outtype: FileType) -> ConvertOptions {
    ConvertOptions {
        outtype,
        no_mtp: true,
        model_name: Some("tiny-v1".to_string()),
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

fn check_mmproj(outtype: FileType) {
    let dir = tempfile::tempdir().unwrap();
    let hf = shared("tiny-v1/hf");
    let weights = std::fs::read(hf.join("model.safetensors")).unwrap();
    let out = dir.path().join("mmproj.gguf");
    let s = convert_mmproj(&hf, &out, &opts(outtype)).unwrap();
    assert_eq!(s.n_tensors, 34);
    assert_same_file(
        &out,
        &shared(&format!("tiny-v1/mmproj-tiny-v1-{outtype}.gguf")),
    );
    assert!(
        std::fs::read(hf.join("model.safetensors")).unwrap() == weights,
        "the checkpoint changed"
    );
}

#[test]
fn mmproj_f32_is_byte_identical() {
    check_mmproj(FileType::F32);
}

#[test]
fn mmproj_f16_is_byte_identical() {
    check_mmproj(FileType::F16);
}

#[test]
fn text_model_of_the_vision_checkpoint_is_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("text.gguf");
    let s = convert(&shared("tiny-v1/hf"), &out, &opts(FileType::F32)).unwrap();
    assert_eq!(s.skipped_vision, 33);
    assert_same_file(&out, &shared("tiny-v1/tiny-v1-F32.gguf"));
}

/// BF16 and Q8_0 (no llama.cpp fixture): the F16 file's tensors and keys, with the matrices that are
/// F16 there in the wanted type, except the patch embedding, which the converter keeps F32; the data is
/// the F32 file's values in those types.
#[test]
fn mmproj_bf16_and_q8_0_follow_the_converter_rules() {
    let f32_ref = GgufFile::open(shared("tiny-v1/mmproj-tiny-v1-F32.gguf")).unwrap();
    let f16_ref = GgufFile::open(shared("tiny-v1/mmproj-tiny-v1-F16.gguf")).unwrap();
    for (outtype, wanted) in [
        (FileType::BF16, GgmlType::BF16),
        (FileType::Q8_0, GgmlType::Q8_0),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("mmproj.gguf");
        convert_mmproj(&shared("tiny-v1/hf"), &out, &opts(outtype)).unwrap();
        let f = GgufFile::open(&out).unwrap();
        assert_eq!(f.get_u64("general.file_type").unwrap(), outtype.id() as u64);
        let keys: Vec<&str> = f.keys().collect();
        assert_eq!(keys, f16_ref.keys().collect::<Vec<_>>());
        assert_eq!(f.tensors().len(), f16_ref.tensors().len());
        for (t, r) in f.tensors().iter().zip(f16_ref.tensors()) {
            assert_eq!((&t.name, &t.ne), (&r.name, &r.ne));
            let want = match r.ty {
                GgmlType::F16 if t.name.starts_with("v.patch_embd.") => GgmlType::F32,
                GgmlType::F16 => wanted,
                ty => ty,
            };
            assert_eq!(t.ty, want, "{} in the {outtype} file", t.name);
            // The data: the F32 reference's values, converted row by row.
            let (_, src) = f32_ref.tensor_by_name(&t.name).unwrap();
            let x: Vec<f32> = src
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let row = t.ne[0] as usize;
            let rb = t.ty.row_bytes(row as u64).unwrap() as usize;
            let mut expect = vec![0u8; x.len() / row * rb];
            for (o, r) in expect.chunks_exact_mut(rb).zip(x.chunks_exact(row)) {
                quantize_row(t.ty, r, o).unwrap();
            }
            assert!(f.tensor_data(t) == expect, "data of {}", t.name);
        }
    }
}

#[test]
fn mmproj_rejects_types_the_converter_does_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mmproj.gguf");
    let err = convert_mmproj(&shared("tiny-v1/hf"), &out, &opts(FileType::Q4_K_M)).unwrap_err();
    assert!(format!("{err:#}").contains("q4_k_m"), "{err:#}");
    assert!(!out.exists());
}

// ---- errors --------------------------------------------------------------------------------------

/// A writable copy of the tiny-v1 checkpoint.
fn v1_copy(dir: &Path) -> PathBuf {
    let hf = dir.join("hf");
    std::fs::create_dir(&hf).unwrap();
    for e in std::fs::read_dir(shared("tiny-v1/hf")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), hf.join(e.file_name())).unwrap();
    }
    hf
}

fn edit_config(hf: &Path, f: impl FnOnce(&mut Value)) {
    let p = hf.join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut cfg);
    std::fs::write(&p, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
}

/// Rewrites model.safetensors with `keep` deciding which tensors stay.
fn filter_tensors(hf: &Path, keep: impl Fn(&str) -> bool) {
    let tensors: Vec<(String, String, Vec<u64>, Vec<u8>)> = {
        let ck = Checkpoint::open(hf).unwrap();
        ck.tensors
            .iter()
            .filter(|t| keep(&t.name))
            .map(|t| {
                let data = ck.map(t, 0, t.nbytes).unwrap().to_vec();
                (t.name.clone(), t.dtype_name.clone(), t.shape.clone(), data)
            })
            .collect()
    };
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape, data) in &tensors {
        let end = offset + data.len() as u64;
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let h = serde_json::to_vec(&Value::Object(header)).unwrap();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    for (_, _, _, data) in &tensors {
        bytes.extend_from_slice(data);
    }
    std::fs::write(hf.join("model.safetensors"), bytes).unwrap();
}

/// Converts with `--mmproj` and expects an error mentioning `needle`; no output may be left behind.
fn expect_error(hf: &Path, needle: &str) {
    let out = hf.parent().unwrap().join("mmproj.gguf");
    let err = match convert_mmproj(hf, &out, &opts(FileType::F16)) {
        Ok(_) => panic!("converting {} should fail", hf.display()),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains(needle),
        "error {err:?} does not mention {needle:?}"
    );
    assert!(!out.exists(), "a failed conversion left {}", out.display());
    let leftovers = std::fs::read_dir(hf.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .count();
    assert_eq!(leftovers, 0, "temporary files left behind");
}

#[test]
fn text_only_checkpoint_has_no_vision_tower() {
    let dir = tempfile::tempdir().unwrap();
    let hf = v1_copy(dir.path());
    edit_config(&hf, |c| {
        c.as_object_mut().unwrap().remove("vision_config");
    });
    expect_error(&hf, "no \"vision_config\"");
}

#[test]
fn missing_vision_tensor_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = v1_copy(dir.path());
    filter_tensors(&hf, |n| n != "model.visual.blocks.1.mlp.linear_fc2.weight");
    expect_error(&hf, "model.visual.blocks.1.mlp.linear_fc2.weight");
}

#[test]
fn missing_preprocessor_config_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = v1_copy(dir.path());
    std::fs::remove_file(hf.join("preprocessor_config.json")).unwrap();
    expect_error(&hf, "preprocessor_config.json");
}

#[test]
fn vision_shape_mismatch_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = v1_copy(dir.path());
    edit_config(&hf, |c| {
        c["vision_config"]["intermediate_size"] = json!(128)
    });
    expect_error(&hf, "config.json implies");
}

#[test]
fn extra_vision_block_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = v1_copy(dir.path());
    edit_config(&hf, |c| c["vision_config"]["depth"] = json!(1));
    expect_error(&hf, "cannot map vision tensor 'model.visual.blocks.1.");
}

#[test]
fn other_temporal_patch_size_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let hf = v1_copy(dir.path());
    edit_config(&hf, |c| {
        c["vision_config"]["temporal_patch_size"] = json!(1)
    });
    expect_error(&hf, "temporal_patch_size");
}
