//! Tokenizer, chat template and `deltaq tokenize` against the shared fixtures.
//!
//! Needs `tools/fetch-fixtures.sh` to have copied the fixtures into `tests/fixtures/shared/`:
//! * `tokenizer/ggml-vocab-qwen35.gguf{,.inp,.out}`: the real 248,320-token Qwen3.5 vocabulary and
//!   llama.cpp's 50 test strings with the ids llama.cpp gives for them;
//! * `tiny-kjv/hf/tokenizer.json` (+ `tokenizer_config.json`): a small byte-level BPE with the
//!   Qwen3.5 pre-tokenizer. There is no GGUF of it among the fixtures, so the test writes one with
//!   `GgufWriter` the way `convert_hf_to_gguf.py` would (tokens by id, padded to the model's 4160
//!   rows with `[PAD<id>]` UNUSED entries; the special added tokens CONTROL; merges as "a b") and
//!   checks our tokenizer built from it against the `tokenizers` crate loading `tokenizer.json`;
//! * `text/eval-john.txt`: the text for that comparison.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use deltaq::chat::{split_thinking, ChatMessage, ChatOptions, ChatTemplate};
use deltaq::gguf::{GgufError, GgufFile, GgufWriter, OwnedValue, ValueType};
use deltaq::tokenizer::{byte_to_char_table, StreamDecoder, TokenType, Tokenizer};

fn fixture(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/shared")
        .join(rel);
    assert!(
        p.exists(),
        "missing test fixture tests/fixtures/shared/{rel}: run tools/fetch-fixtures.sh first \
         (it copies the large fixtures from the shared folder)"
    );
    p
}

const VOCAB: &str = "tokenizer/ggml-vocab-qwen35.gguf";

/// The 248k-token tokenizer, built once for all tests of this file.
fn qwen35() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let f = GgufFile::open(fixture(VOCAB)).unwrap();
        Tokenizer::from_gguf(&f).unwrap()
    })
}

fn vocab_cases() -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(fixture(&format!("{VOCAB}.inp"))).unwrap();
    let out = std::fs::read_to_string(fixture(&format!("{VOCAB}.out"))).unwrap();
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // Nothing after the last separator is a test.
    assert_eq!(texts.pop(), Some(""));
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len());
    texts.into_iter().map(String::from).zip(ids).collect()
}

#[test]
fn qwen35_vocab_all_50_cases() {
    let tok = qwen35();
    assert_eq!(tok.n_vocab(), 248_320);
    let cases = vocab_cases();
    assert_eq!(cases.len(), 50);
    let mut bad = Vec::new();
    for (i, (text, want)) in cases.iter().enumerate() {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            bad.push(format!("case {i} {text:?}: got {got:?}, want {want:?}"));
        }
        let back = tok.decode(&got, false);
        if &back != text {
            bad.push(format!("case {i} {text:?}: decodes to {back:?}"));
        }
        // Streaming, one token at a time, gives the same text.
        let mut d = StreamDecoder::new(false);
        let mut streamed: String = got.iter().map(|&id| d.push(tok, id)).collect();
        streamed.push_str(&d.flush());
        if &streamed != text {
            bad.push(format!("case {i} {text:?}: streams to {streamed:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} problems:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn qwen35_vocab_metadata_and_examples() {
    let tok = qwen35();
    assert_eq!(tok.pre(), "qwen35");
    assert_eq!(tok.bos(), Some(248044));
    assert_eq!(tok.eos(), Some(248046));
    assert_eq!(tok.pad(), Some(248055));
    assert!(!tok.add_bos());
    assert_eq!(tok.eog_ids(), &[248044, 248046]);
    assert_eq!(tok.special_id("<think>"), Some(248068));
    assert_eq!(tok.special_id("</think>"), Some(248069));
    assert_eq!(tok.token_type(248045), Some(TokenType::Control));
    assert_eq!(tok.token_type(248100), Some(TokenType::Unused));
    assert_eq!(tok.token_type(9419), Some(TokenType::Normal));
    assert_eq!(tok.encode("Hello world", false).unwrap(), vec![9419, 1814]);
    assert_eq!(
        tok.encode(" Hello world", false).unwrap(),
        vec![21251, 1814]
    );
    assert_eq!(tok.encode("3333", false).unwrap().len(), 4);
    assert_eq!(tok.encode("", false).unwrap(), Vec::<u32>::new());
    // Decomposed é (no NFC): e + U+0301. (The fixture README's value; spec §5.2 quotes 53839.)
    assert_eq!(tok.encode("e\u{301}", false).unwrap(), vec![68, 52033]);
    assert_eq!(tok.token_text(1814), Some("Ġworld"));
    assert_eq!(&*tok.token_to_piece(1814, false), b" world");
    // UNUSED ids and ids out of range decode to nothing.
    assert_eq!(tok.decode(&[248100, 999_999], true), "");
}

#[test]
fn special_tokens_parsed_only_when_asked() {
    let tok = qwen35();
    let text = "<|im_start|>user\nHi<|im_end|>\n<think>";
    let on = tok.encode(text, true).unwrap();
    assert_eq!(on[0], 248045);
    assert_eq!(on[1..3], [846, 198]);
    assert!(on.contains(&248046));
    assert_eq!(*on.last().unwrap(), 248068);
    // Control tokens are hidden unless asked for.
    assert_eq!(tok.decode(&on, true), text);
    assert_eq!(tok.decode(&on, false), "user\nHi\n");

    let off = tok.encode(text, false).unwrap();
    assert!(off.iter().all(|&id| id < 248044), "{off:?}");
    assert!(off.len() > on.len());
    assert_eq!(tok.decode(&off, false), text);
    // `<|im_start|>` as plain text: several ordinary tokens.
    assert!(tok.encode("<|im_start|>", false).unwrap().len() > 1);
}

#[test]
fn streaming_holds_back_split_characters() {
    let tok = qwen35();
    let table = byte_to_char_table();
    // 😀 as its four byte tokens.
    let ids: Vec<u32> = "😀"
        .bytes()
        .map(|b| {
            tok.token_to_id(&table[b as usize].to_string())
                .expect("byte token")
        })
        .collect();
    assert_eq!(ids.len(), 4);
    let mut d = StreamDecoder::new(false);
    assert_eq!(d.push(tok, ids[0]), "");
    assert_eq!(d.push(tok, ids[1]), "");
    assert_eq!(d.push(tok, ids[2]), "");
    assert_eq!(d.pending().len(), 3);
    assert_eq!(d.push(tok, ids[3]), "😀");
    assert_eq!(d.flush(), "");
    // The whole sequence at once (non-streaming) too.
    assert_eq!(tok.decode(&ids, false), "😀");

    // A rare 4-byte character in running text spans several tokens; no chunk has a broken char.
    let text = "x 𝔘𝔫𝔦 🦀🦀 done";
    let ids = tok.encode(text, false).unwrap();
    let mut d = StreamDecoder::new(false);
    let chunks: Vec<String> = ids.iter().map(|&id| d.push(tok, id)).collect();
    assert!(chunks.iter().all(|c| !c.contains('\u{fffd}')), "{chunks:?}");
    assert!(
        chunks.iter().filter(|c| c.is_empty()).count() > 0,
        "expected some held-back bytes: {chunks:?}"
    );
    assert_eq!(chunks.concat() + &d.flush(), text);
}

/// Writes a GGUF holding the tiny-kjv tokenizer, from its tokenizer.json, and returns its path.
fn tiny_kjv_gguf(dir: &Path) -> PathBuf {
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("tiny-kjv/hf/tokenizer.json")).unwrap(),
    )
    .unwrap();
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("tiny-kjv/hf/tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    const N_VOCAB: usize = 4160;
    let mut tokens: Vec<Option<String>> = vec![None; N_VOCAB];
    let mut types = vec![TokenType::Unused; N_VOCAB];
    for (text, id) in json["model"]["vocab"].as_object().unwrap() {
        let id = id.as_u64().unwrap() as usize;
        tokens[id] = Some(text.clone());
        types[id] = TokenType::Normal;
    }
    for added in json["added_tokens"].as_array().unwrap() {
        let id = added["id"].as_u64().unwrap() as usize;
        tokens[id] = Some(added["content"].as_str().unwrap().to_string());
        types[id] = if added["special"].as_bool().unwrap() {
            TokenType::Control
        } else {
            TokenType::UserDefined
        };
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| format!("[PAD{i}]")))
        .collect();
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(pair) => format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            ),
            other => panic!("merge {other}"),
        })
        .collect();
    let eos = tokens.iter().position(|t| t == "<|endoftext|>").unwrap() as u32;

    let mut w = GgufWriter::new();
    w.set("general.architecture", OwnedValue::str("qwen35"));
    w.set("tokenizer.ggml.model", OwnedValue::str("gpt2"));
    w.set("tokenizer.ggml.pre", OwnedValue::str("qwen35"));
    w.set("tokenizer.ggml.tokens", OwnedValue::strings(&tokens));
    w.set(
        "tokenizer.ggml.token_type",
        OwnedValue::Array(
            ValueType::I32,
            types.iter().map(|t| OwnedValue::I32(t.to_gguf())).collect(),
        ),
    );
    w.set("tokenizer.ggml.merges", OwnedValue::strings(&merges));
    w.set("tokenizer.ggml.eos_token_id", OwnedValue::U32(eos));
    w.set("tokenizer.ggml.padding_token_id", OwnedValue::U32(eos));
    w.set("tokenizer.ggml.add_bos_token", OwnedValue::Bool(false));
    w.set(
        "tokenizer.chat_template",
        OwnedValue::str(config["chat_template"].as_str().unwrap()),
    );
    let path = dir.join("tiny-kjv-vocab.gguf");
    w.write_to_path::<GgufError>(&path, true, |_, _, _| Ok(()))
        .unwrap();
    path
}

#[test]
fn tiny_kjv_from_gguf_matches_tokenizer_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_kjv_gguf(dir.path());
    let t0 = Instant::now();
    let f = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    eprintln!(
        "tiny-kjv tokenizer (4160 tokens) built in {:?}",
        t0.elapsed()
    );
    assert_eq!(tok.n_vocab(), 4160);
    assert_eq!(tok.eos(), Some(4096));
    assert_eq!(tok.eog_ids(), &[4096, 4098]);

    let reference =
        tokenizers::Tokenizer::from_file(fixture("tiny-kjv/hf/tokenizer.json")).unwrap();
    let john = std::fs::read_to_string(fixture("text/eval-john.txt")).unwrap();
    let ours = tok.encode(&john, false).unwrap();
    let theirs = reference
        .encode(john.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ours.len(), 24_154, "README: eval-john is 24,154 tokens");
    if ours != theirs {
        let i = ours
            .iter()
            .zip(&theirs)
            .position(|(a, b)| a != b)
            .unwrap_or(ours.len().min(theirs.len()));
        panic!(
            "differs from tokenizer.json at token {i}: ours {:?} theirs {:?}",
            &ours[i..],
            &theirs[i..]
        );
    }
    assert_eq!(tok.decode(&ours, false), john);
    // The golden prompt of the README.
    assert_eq!(
        tok.encode("In the beginning", false).unwrap(),
        vec![3414, 258, 2199]
    );
    assert_eq!(
        tok.encode("And Jesus said unto them,", false).unwrap(),
        vec![1080, 733, 393, 322, 341, 11]
    );

    // Special tokens: the HF tokenizer always matches them, like ours with parse_special.
    let chat = "<|im_start|>user\nAnd God said<|im_end|>\n<think>\n</think>";
    let ours = tok.encode(chat, true).unwrap();
    assert_eq!(ours, reference.encode(chat, false).unwrap().get_ids());
    assert_eq!(ours[0], 4097);
    let plain = tok.encode(chat, false).unwrap();
    assert!(plain.iter().all(|&id| id < 4096));
    assert_eq!(tok.decode(&plain, false), chat);

    // Many lines one by one (short inputs exercise other regex paths than the whole text).
    for line in john.lines().take(400) {
        let ours = tok.encode(line, false).unwrap();
        assert_eq!(
            ours,
            reference.encode(line, false).unwrap().get_ids(),
            "{line:?}"
        );
    }

    // The chat template of the GGUF renders.
    let tmpl = ChatTemplate::from_gguf(&f).unwrap();
    let prompt = tmpl
        .render(&[ChatMessage::user("Hi")], &ChatOptions::generation(true))
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    );
    assert_eq!(tok.encode(&prompt, true).unwrap()[0], 4097);
}

#[test]
fn tokenizer_can_be_built_and_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>();
    send_sync::<ChatTemplate>();
}

#[test]
fn build_time_248k_vocab() {
    let t0 = Instant::now();
    let f = GgufFile::open(fixture(VOCAB)).unwrap();
    let opened = t0.elapsed();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let built = t0.elapsed();
    eprintln!("248,320-token tokenizer (500,709 merges): GGUF open {opened:?}, tokenizer ready after {built:?}");
    assert_eq!(tok.n_vocab(), 248_320);
    // Generous bound: catches an accidental quadratic build, not slow machines.
    assert!(built.as_secs_f64() < 30.0, "{built:?}");
}

fn vocab_template() -> ChatTemplate {
    let f = GgufFile::open(fixture(VOCAB)).unwrap();
    ChatTemplate::from_gguf(&f).unwrap()
}

fn history() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("You are a helpful assistant."),
        ChatMessage::user("Hi!"),
        ChatMessage::assistant("Hello! How can I help?").with_reasoning("The user greets me."),
        ChatMessage::user("  What is 2+2?\n"),
        ChatMessage::assistant("4").with_reasoning("\nSimple arithmetic.\n"),
    ]
}

// The expected strings were read off the template and cross-checked by rendering it with Python's
// jinja2 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, as transformers does).

#[test]
fn chat_single_user_thinking_on() {
    let t = vocab_template();
    let msgs = [ChatMessage::user("What is 2+2?")];
    let want = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    assert_eq!(
        t.render(&msgs, &ChatOptions::generation(true)).unwrap(),
        want
    );
    // enable_thinking left undefined: thinking on too.
    let opts = ChatOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    assert_eq!(t.render(&msgs, &opts).unwrap(), want);
    // The spec's token stream: 248045 846 198 … 248046 198 248045 74455 198 248068 198.
    let ids = qwen35().encode(want, true).unwrap();
    assert_eq!(ids[..3], [248045, 846, 198]);
    assert_eq!(
        ids[ids.len() - 7..],
        [248046, 198, 248045, 74455, 198, 248068, 198]
    );
}

#[test]
fn chat_single_user_thinking_off() {
    let t = vocab_template();
    let msgs = [ChatMessage::user("What is 2+2?")];
    assert_eq!(
        t.render(&msgs, &ChatOptions::generation(false)).unwrap(),
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
}

#[test]
fn chat_history_with_reasoning() {
    let t = vocab_template();
    // Reasoning is kept only for the assistant turn after the last user query; content trimmed.
    let want = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
                <|im_start|>user\nHi!<|im_end|>\n\
                <|im_start|>assistant\nHello! How can I help?<|im_end|>\n\
                <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
                <|im_start|>assistant\n<think>\nSimple arithmetic.\n</think>\n\n4<|im_end|>\n";
    assert_eq!(t.render(&history(), &ChatOptions::default()).unwrap(), want);

    // Reasoning inline in an earlier assistant turn's content is stripped.
    let msgs = vec![
        ChatMessage::system("You are a helpful assistant."),
        ChatMessage::user("Hi!"),
        ChatMessage::assistant("<think>\nold thought\n</think>\n\nHello!"),
        ChatMessage::user("And now?"),
    ];
    assert_eq!(
        t.render(&msgs, &ChatOptions::generation(true)).unwrap(),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n\
         <|im_start|>assistant\n<think>\n"
    );
}

#[test]
fn chat_tools_and_tool_responses() {
    use minijinja::Value;
    use std::collections::BTreeMap;
    let t = vocab_template();
    // Keys in sorted order, so that the map's order equals Python's insertion order.
    let map = |items: Vec<(&str, Value)>| {
        Value::from(items.into_iter().collect::<BTreeMap<&str, Value>>())
    };
    let tool = map(vec![
        (
            "function",
            map(vec![
                ("name", Value::from("get_weather")),
                (
                    "parameters",
                    map(vec![
                        ("city", Value::from("string")),
                        (
                            "n",
                            Value::from(vec![
                                Value::from(1),
                                Value::from(2.5),
                                Value::from(true),
                                Value::from(()),
                            ]),
                        ),
                    ]),
                ),
            ]),
        ),
        ("type", Value::from("function")),
    ]);
    let msgs = vec![
        ChatMessage::user("Weather in Paris?"),
        ChatMessage::assistant("Let me check."),
        ChatMessage::new("tool", "{\"temp\": 21}"),
        ChatMessage::new("tool", "sunny"),
    ];
    let mut opts = ChatOptions::generation(false);
    opts.extra.push(("tools".into(), Value::from(vec![tool])));
    let got = t.render(&msgs, &opts).unwrap();
    let want = "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n\
        {\"function\": {\"name\": \"get_weather\", \"parameters\": {\"city\": \"string\", \"n\": [1, 2.5, true, null]}}, \"type\": \"function\"}\n\
        </tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n\
        <tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n\
        <parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n\
        </parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n\
        - Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n\
        - Required parameters MUST be specified\n\
        - You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n\
        - If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n\
        </IMPORTANT><|im_end|>\n\
        <|im_start|>user\nWeather in Paris?<|im_end|>\n\
        <|im_start|>assistant\n<think>\n\n</think>\n\nLet me check.<|im_end|>\n\
        <|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n\
        <|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert_eq!(got, want);
}

#[test]
fn chat_template_errors_are_reported() {
    let t = vocab_template();
    let err = t
        .render(&[], &ChatOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("No messages provided."), "{err}");
    let err = t
        .render(&[ChatMessage::new("robot", "x")], &ChatOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("No user query found") || err.contains("Unexpected message role"),
        "{err}"
    );
}

#[test]
fn think_split_of_generated_tokens() {
    let tok = qwen35();
    // What a thinking-mode generation looks like as tokens (the prompt ended with "<think>\n").
    let generated = tok
        .encode("The user asks 2+2.\n</think>\n\n2 + 2 = 4.", true)
        .unwrap();
    assert!(generated.contains(&248069));
    let text = tok.decode(&generated, true);
    let s = split_thinking(&text, true);
    assert_eq!(s.thinking.as_deref(), Some("The user asks 2+2."));
    assert_eq!(s.answer, "2 + 2 = 4.");
}

#[test]
fn cli_tokenize() {
    let exe = env!("CARGO_BIN_EXE_deltaq");
    let model = fixture(VOCAB);
    let run = |args: &[&str]| {
        let out = std::process::Command::new(exe)
            .arg("tokenize")
            .arg("-m")
            .arg(&model)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(
        run(&["Hello world"]),
        "  9419 -> 'Hello'\n  1814 -> ' world'\n"
    );
    assert_eq!(run(&["--ids", "Hello world"]), "9419 1814\n");
    assert_eq!(
        run(&["--ids", "--special", "<|im_start|>user"]),
        "248045 846\n"
    );
    let plain = run(&["--ids", "<|im_start|>user"]);
    assert!(!plain.contains("248045"), "{plain}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.txt");
    std::fs::write(&file, " Hello world").unwrap();
    assert_eq!(
        run(&["--ids", "-f", file.to_str().unwrap()]),
        "21251 1814\n"
    );
}

/// Resident kB of this process's mapping that contains `addr` (Linux `/proc/self/smaps`).
#[cfg(target_os = "linux")]
fn mapping_rss_kb(addr: usize) -> u64 {
    let fields = deltaq::bench::mapping_kb(addr).expect("a mapping holds the address");
    fields
        .iter()
        .find(|(n, _)| n == "Rss")
        .expect("an Rss field")
        .1
}

#[test]
#[cfg(target_os = "linux")]
fn metadata_pages_leave_the_resident_set_and_read_the_same_afterwards() {
    let f = GgufFile::open(fixture(VOCAB)).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let text = "In the beginning God created the heaven and the earth. 3333 é";
    let ids = tok.encode(text, false).unwrap();
    let tokens = |f: &GgufFile| -> Vec<Vec<u8>> {
        let a = f.get_array("tokenizer.ggml.tokens").unwrap();
        a.strings().unwrap().map(|s| s.to_vec()).collect()
    };
    let before_tokens = tokens(&f);
    let addr = f.bytes().as_ptr() as usize;
    let before = mapping_rss_kb(addr);
    assert!(
        before * 1024 > f.bytes().len() as u64 / 2,
        "the vocabulary was read: {before} kB resident"
    );
    f.release_metadata_pages();
    let after = mapping_rss_kb(addr);
    // The file is all metadata: at most its last 64 KiB granule stays.
    assert!(after <= 64 + 4, "{before} kB -> {after} kB resident");
    // The same bytes come back on the next read, and a tokenizer built from them is the same.
    assert!(tokens(&f) == before_tokens);
    let tok2 = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok2.encode(text, false).unwrap(), ids);
}
