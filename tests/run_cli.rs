//! `deltaq run` with the bundled demo model, as the README's first command uses it.

use std::process::Command;

fn deltaq(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_deltaq"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn demo_model_writes_kjv_style_text() {
    let (ok, out, err) = deltaq(&[
        "run",
        "--raw",
        "-p",
        "And God said",
        "-n",
        "120",
        "--temp",
        "0",
    ]);
    assert!(ok, "{err}");
    assert!(out.starts_with("And God said"), "{out}");
    let words: Vec<&str> = out.split_whitespace().collect();
    assert!(words.len() > 60, "{out}");
    // Trained on the King James Bible: its function words must make up much of the text.
    let common = [
        "the", "and", "of", "unto", "LORD", "God", "shall", "he", "that", "said", "thou", "thee",
        "thy", "ye", "I", "my", "not", "nor", "for", "is", "in", "a", "to", "his", "him", "them",
        "they", "be", "will", "hast", "hath", "was", "with", "me", "all", "which", "And", "But",
        "For", "upon", "their", "are", "as", "it",
    ];
    let hits = words
        .iter()
        .filter(|w| common.contains(&w.trim_matches(|c: char| !c.is_alphanumeric())))
        .count();
    assert!(hits * 3 > words.len(), "too few common KJV words in: {out}");
    assert!(out.is_ascii(), "{out}");
    assert!(
        err.contains("generation: 120 tokens") && err.contains("tokens/s"),
        "{err}"
    );
}

#[test]
fn greedy_generation_is_deterministic_and_seeded_sampling_repeats() {
    let a = deltaq(&[
        "run",
        "--raw",
        "-p",
        "In the beginning",
        "-n",
        "30",
        "--temp",
        "0",
    ])
    .1;
    let b = deltaq(&[
        "run",
        "--raw",
        "-p",
        "In the beginning",
        "-n",
        "30",
        "--temp",
        "0",
    ])
    .1;
    assert_eq!(a, b);
    let c = deltaq(&[
        "run",
        "--raw",
        "-p",
        "In the beginning",
        "-n",
        "30",
        "--seed",
        "7",
    ])
    .1;
    let d = deltaq(&[
        "run",
        "--raw",
        "-p",
        "In the beginning",
        "-n",
        "30",
        "--seed",
        "7",
    ])
    .1;
    assert_eq!(c, d);
}

/// `--kv-type f32` (the exact cache) generates deterministically too; an unknown type is refused.
#[test]
fn kv_type_f32_runs() {
    let run = || {
        deltaq(&[
            "run",
            "--raw",
            "-p",
            "In the beginning",
            "-n",
            "12",
            "--temp",
            "0",
            "--kv-type",
            "f32",
        ])
    };
    let (ok, a, err) = run();
    assert!(ok, "{err}");
    assert!(a.len() > "In the beginning".len(), "{a}");
    assert_eq!(a, run().1);
    let (ok, _, err) = deltaq(&["run", "-p", "x", "--kv-type", "bf16"]);
    assert!(!ok && err.contains("unknown KV cache type"), "{err}");
}

#[test]
fn chat_without_thinking_has_no_think_block() {
    let (ok, out, err) = deltaq(&[
        "run",
        "-p",
        "Who made the heaven?",
        "--no-think",
        "-n",
        "40",
        "--seed",
        "1",
    ]);
    assert!(ok, "{err}");
    assert!(
        !out.contains("<think>") && !out.contains("</think>"),
        "{out}"
    );
    // With thinking on and stdout piped, the thinking is shown between tags.
    let (ok, out, _) = deltaq(&[
        "run",
        "-p",
        "Who made the heaven?",
        "-n",
        "20",
        "--seed",
        "1",
    ]);
    assert!(ok);
    assert!(out.starts_with("<think>\n"), "{out}");
    let (_, hidden, _) = deltaq(&[
        "run",
        "-p",
        "Who made the heaven?",
        "-n",
        "20",
        "--seed",
        "1",
        "--hide-think",
    ]);
    assert!(!hidden.contains("<think>"), "{hidden}");
}

#[test]
fn clear_errors() {
    let (ok, _, err) = deltaq(&["run", "--raw", "-p", "x", "-c", "100000000"]);
    assert!(
        !ok && err.contains("longer than the model's training context"),
        "{err}"
    );
    let (ok, _, err) = deltaq(&["run", "-m", "no/such.gguf", "-p", "x"]);
    assert!(!ok && err.contains("no/such.gguf"), "{err}");
    let (ok, _, err) = deltaq(&["run", "-m", "tests/fixtures/quant-vectors.gguf", "-p", "x"]);
    assert!(!ok && err.contains("deltaq-quant-vectors"), "{err}");
}

/// `deltaq run` drafting with the demo model's MTP block, on every kernel table this CPU runs: greedy
/// text with 1, 2 and 3 drafts per step (drafting forced on every step) is the text without drafts,
/// and the run reports its draft counts.
#[test]
fn drafting_is_token_identical_on_every_isa() {
    let prompt = "And it came to pass, when the king had heard";
    for isa in deltaq::kernels::available() {
        let run = |draft: &str| {
            let out = Command::new(env!("CARGO_BIN_EXE_deltaq"))
                .args([
                    "run", "--raw", "-p", prompt, "-n", "256", "--temp", "0", "-t", "2",
                ])
                .args(["--draft", draft, "--draft-always"])
                .env("DELTAQ_ISA", isa.isa.name())
                .output()
                .expect("running deltaq");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            (
                String::from_utf8(out.stdout).unwrap(),
                String::from_utf8(out.stderr).unwrap(),
            )
        };
        let (plain, err0) = run("0");
        assert!(!err0.contains("draft tokens"), "{err0}");
        for k in ["1", "2", "3"] {
            let (text, err) = run(k);
            assert_eq!(text, plain, "{}: --draft {k}", isa.isa.name());
            let line = err
                .lines()
                .find(|l| l.starts_with("draft tokens: "))
                .unwrap();
            let proposed: u64 = line["draft tokens: ".len()..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(proposed > 0, "{line}");
        }
    }
}

/// The demo model without its chat template, written with the crate's own GGUF writer.
fn demo_model_without_template(dir: &std::path::Path) -> std::path::PathBuf {
    use deltaq::gguf::{GgufFile, GgufWriter, TensorSpec};
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-kjv-mtp-Q8_0.gguf");
    let f = GgufFile::open(&src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        if k != "tokenizer.chat_template" {
            w.set(k, v.to_owned_value());
        }
    }
    for t in f.tensors() {
        w.add_tensor(TensorSpec::new(t.name.clone(), t.ty, &t.ne))
            .unwrap();
    }
    let out = dir.join("no-template.gguf");
    w.write_to_path::<deltaq::gguf::GgufError>(&out, false, |i, _, sink| {
        sink.write_all(f.tensor_data(&f.tensors()[i]))
            .map_err(|e| deltaq::gguf::GgufError::Io(e.to_string()))
    })
    .unwrap();
    out
}

#[test]
fn a_model_without_a_chat_template_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model_without_template(dir.path());
    let m = model.to_str().unwrap();
    // chat mode (no prompt): an error naming the file and the way out, not a hang on stdin
    let (ok, out, err) = deltaq(&["run", "-m", m]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("no-template.gguf has no usable chat template")
            && err.contains("tokenizer.chat_template")
            && err.contains("-p"),
        "{err}"
    );
    // a prompt is continued as plain text, with a note
    let (ok, out, err) = deltaq(&[
        "run",
        "-m",
        m,
        "-p",
        "And God said",
        "-n",
        "8",
        "--temp",
        "0",
    ]);
    assert!(ok, "{err}");
    assert!(out.starts_with("And God said"), "{out}");
    assert!(err.contains("no usable chat template"), "{err}");
}

#[test]
fn an_empty_prompt_is_refused_before_the_model_loads() {
    for prompt in ["", "  \n"] {
        for extra in [&[][..], &["--raw"][..]] {
            let mut args = vec!["run", "-m", "no-such-file.gguf", "-p", prompt];
            args.extend_from_slice(extra);
            let (ok, _, err) = deltaq(&args);
            assert!(!ok);
            assert!(
                err.contains("the prompt is empty") && err.contains("interactive chat"),
                "{err}"
            );
        }
    }
}

/// `-f FILE` is `-p` with the file's text (one trailing newline dropped, as llama.cpp's `-f`); a
/// missing or non-UTF-8 file, or `-f` with `-p`, is a clear error.
#[test]
fn prompt_from_file() {
    let dir = std::env::temp_dir().join(format!("deltaq-run-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("prompt.txt");
    std::fs::write(&text, "In the beginning\n").unwrap();
    fn args(src: &[&str]) -> (bool, String, String) {
        let mut v = vec!["run", "--raw", "-n", "12", "--temp", "0"];
        v.extend_from_slice(src);
        deltaq(&v)
    }
    let (ok, from_flag, err) = args(&["-p", "In the beginning"]);
    assert!(ok, "{err}");
    let (ok, from_file, err) = args(&["-f", text.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(from_file, from_flag);

    let (ok, _, err) = args(&["-f", dir.join("missing.txt").to_str().unwrap()]);
    assert!(
        !ok && err.contains("reading the prompt file") && err.contains("missing.txt"),
        "{err}"
    );
    let latin1 = dir.join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9").unwrap();
    let (ok, _, err) = args(&["-f", latin1.to_str().unwrap()]);
    assert!(
        !ok && err.contains("not UTF-8") && err.contains("offset 3"),
        "{err}"
    );
    let (ok, _, err) = args(&["-f", text.to_str().unwrap(), "-p", "x"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `-c` beyond the training context (4096 for the demo model) needs RoPE scaling: refused without it
/// (the error names the flags), run with YaRN ×2 up to 8192; YaRN changes the text's logits, so greedy
/// text may differ, and a bad factor is a clear error.
#[test]
fn context_beyond_training_needs_rope_scaling() {
    let base = [
        "run",
        "--raw",
        "-p",
        "In the beginning",
        "-n",
        "8",
        "--temp",
        "0",
    ];
    let with = |extra: &[&str]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        deltaq(&v)
    };
    let (ok, _, err) = with(&["-c", "8192"]);
    assert!(
        !ok && err.contains("--rope-scaling yarn --rope-scale 2"),
        "{err}"
    );
    let (ok, out, err) = with(&["-c", "8192", "--rope-scaling", "yarn", "--rope-scale", "2"]);
    assert!(ok && out.starts_with("In the beginning"), "{err}");
    let (ok, _, err) = with(&["-c", "8193", "--rope-scaling", "yarn", "--rope-scale", "2"]);
    assert!(
        !ok && err.contains("stretched by the RoPE scaling (8192 tokens)"),
        "{err}"
    );
    let (ok, _, err) = with(&["--rope-scaling", "yarn", "--rope-scale", "0"]);
    assert!(
        !ok && err.contains("--rope-scale must be a positive number"),
        "{err}"
    );
    let (ok, _, err) = with(&["--rope-scaling", "longrope"]);
    assert!(
        !ok && err.contains("unknown RoPE scaling 'longrope'"),
        "{err}"
    );
}
