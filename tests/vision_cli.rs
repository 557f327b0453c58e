//! `deltaq eval` and `deltaq run` with images on tiny-v1 (the fixture's random Qwen3.5
//! vision-language model, F32 text GGUF + F32 mmproj, F32 KV cache): the whole path from the PNG
//! file (decoding, resize, the vision tower, the chat prompt) against transformers' goldens.
//!
//! The fixtures are copied (not committed) by `tools/fetch-fixtures.sh` into tests/fixtures/shared/.

use std::path::PathBuf;
use std::process::Command;

use deltaq::gguf::GgufFile;
use deltaq::npy::{self, NpyArray};
use deltaq::tokenizer::Tokenizer;

fn fixture(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/shared/tiny-v1")
        .join(rel);
    assert!(
        p.exists(),
        "missing test fixture {}: run tools/fetch-fixtures.sh (copies it from ../shared/fixtures)",
        p.display()
    );
    p.display().to_string()
}

fn golden(name: &str) -> NpyArray {
    npy::read(fixture(&format!("golden/{name}.npy")).as_ref()).unwrap()
}

/// (success, stdout as bytes, stderr).
fn deltaq(args: &[&str]) -> (bool, Vec<u8>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_deltaq"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn model_args() -> Vec<String> {
    vec![
        "-m".into(),
        fixture("tiny-v1-F32.gguf"),
        "--mmproj".into(),
        fixture("mmproj-tiny-v1-F32.gguf"),
        "--kv-type".into(),
        "f32".into(),
        "-t".into(),
        "2".into(),
    ]
}

/// `deltaq eval --chat "Describe." --image imgC.png`: the prompt's ids equal transformers' (the
/// processor's image tokens included) and the logits of every position are within 1e-3 of the golden
/// logit range (measured: below 1e-5; img1 and img2 go through the resize).
#[test]
fn eval_image_chat_matches_goldens() {
    let dir = tempfile::tempdir().unwrap();
    for c in 0..3 {
        let logits = dir.path().join(format!("logits{c}.npy"));
        let ids = dir.path().join(format!("ids{c}.npy"));
        let mut args: Vec<String> = vec!["eval".into()];
        args.extend(model_args());
        args.extend([
            "--image".into(),
            fixture(&format!("images/img{c}.png")),
            "--chat".into(),
            "Describe.".into(),
            "-o".into(),
            logits.display().to_string(),
            "--ids-out".into(),
            ids.display().to_string(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, _, err) = deltaq(&args);
        assert!(ok, "chat{c}: {err}");
        assert!(err.contains("encoded in"), "chat{c}: {err}");

        let got_ids = npy::read(&ids).unwrap();
        let want_ids = golden(&format!("chat{c}_input_ids"));
        assert_eq!(got_ids.data, want_ids.data, "chat{c}: token ids");

        let got = npy::read(&logits).unwrap();
        let want = golden(&format!("chat{c}_logits_f64"));
        assert_eq!(got.shape, want.shape, "chat{c}: logits shape");
        let v = want.shape[1];
        let mut worst = 0f64;
        for (p, (row, g)) in got
            .data
            .chunks_exact(v)
            .zip(want.data.chunks_exact(v))
            .enumerate()
        {
            let d = row
                .iter()
                .zip(g)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            let range = g.iter().copied().fold(f64::MIN, f64::max)
                - g.iter().copied().fold(f64::MAX, f64::min);
            assert!(
                d <= 1e-3 * range,
                "chat{c}: position {p}: max |Δlogit| {d:.3e} > 1e-3 × range {range:.3}"
            );
            worst = worst.max(d / range);
        }
        eprintln!("chat{c}: ids equal, max |Δlogit| / range {worst:.3e}");
    }
}

/// `deltaq run --image imgC.png -p "Describe." --temp 0 -n 8` prints the text of transformers' greedy
/// continuation (8 tokens, none of them end of text).
#[test]
fn run_image_greedy_matches_goldens() {
    let f = GgufFile::open(fixture("tiny-v1-F32.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    for c in 0..3 {
        let greedy: Vec<u32> = golden(&format!("chat{c}_greedy"))
            .data
            .iter()
            .map(|&t| t as u32)
            .collect();
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(model_args());
        args.extend([
            "--image".into(),
            fixture(&format!("images/img{c}.png")),
            "-p".into(),
            "Describe.".into(),
            "--temp".into(),
            "0".into(),
            "-n".into(),
            "8".into(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, out, err) = deltaq(&args);
        assert!(ok, "chat{c}: {err}");
        assert!(err.contains("generation: 8 tokens"), "chat{c}: {err}");
        let text = String::from_utf8_lossy(&out);
        let want = tok.decode(&greedy, true);
        assert_eq!(text.trim_end_matches('\n'), want, "chat{c}");
    }
}

#[test]
fn bad_image_input_is_a_clear_error() {
    let img = fixture("images/img0.png");
    let model = fixture("tiny-v1-F32.gguf");
    let (ok, _, err) = deltaq(&["run", "-m", &model, "--image", &img, "-p", "x"]);
    assert!(!ok && err.contains("--image needs --mmproj"), "{err}");

    let mut base: Vec<String> = vec!["run".into()];
    base.extend(model_args());
    let with = |extra: &[&str]| {
        let mut a: Vec<&str> = base.iter().map(String::as_str).collect();
        a.extend_from_slice(extra);
        deltaq(&a)
    };
    let (ok, _, err) = with(&["--image", "no-such-image.png", "-p", "x"]);
    assert!(
        !ok && err.contains("reading the image no-such-image.png"),
        "{err}"
    );
    // A GGUF is not an image.
    let (ok, _, err) = with(&["--image", &model, "-p", "x"]);
    assert!(!ok && err.contains("unrecognised image format"), "{err}");
    // The text model is not an mmproj.
    let (ok, _, err) = deltaq(&[
        "run", "-m", &model, "--mmproj", &model, "--image", &img, "-p", "x",
    ]);
    assert!(!ok && err.contains("not an mmproj file"), "{err}");
    let (ok, _, err) = with(&[
        "--image",
        &img,
        "--image-min-tokens",
        "9",
        "--image-max-tokens",
        "8",
        "-p",
        "x",
    ]);
    assert!(!ok && err.contains("above the maximum"), "{err}");
}

/// Interactive chat: `/image FILE` attaches an image to the next message (through the model's chat
/// template); the image changes the answer, a later turn reuses the conversation, a bad file is an
/// error message and the chat goes on.
#[test]
fn interactive_image_attaches_to_the_next_message() {
    use std::io::Write;
    let chat = |stdin: String| {
        let mut args = vec!["run".to_string()];
        args.extend(model_args());
        args.extend(["--temp", "0", "-n", "6", "--no-think"].map(String::from));
        let mut child = Command::new(env!("CARGO_BIN_EXE_deltaq"))
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let with = |i: usize| {
        chat(format!(
            "/image no-such.png\n/image {}\nDescribe.\nAnd now?\n",
            fixture(&format!("images/img{i}.png"))
        ))
    };
    let (out0, err0) = with(0);
    let (out1, _) = with(1);
    assert!(err0.contains("reading the image no-such.png"), "{err0}");
    assert!(err0.contains("1 image(s) attached"), "{err0}");
    assert_eq!(err0.matches("generation: 6 tokens").count(), 2, "{err0}");
    let (plain, _) = chat("Describe.\n".into());
    let first = |o: &str| o.lines().next().unwrap_or_default().to_string();
    assert_ne!(
        first(&out0),
        first(&out1),
        "the image must change the answer"
    );
    assert_ne!(
        first(&out0),
        first(&plain),
        "the image must change the answer"
    );
}
