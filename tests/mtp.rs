//! Multi-token prediction on tiny-kjv-mtp (tiny-kjv's trunk plus a trained MTP block): the block's
//! logits against the float64 goldens (teacher-forced and chained), drafts through a session, greedy
//! speculative decoding token-identical to plain decoding, acceptance against llama.cpp's, and
//! rollbacks that never compute a token twice.

use std::path::{Path, PathBuf};

use deltaq::convert::{convert, ConvertOptions};
use deltaq::gguf::GgufFile;
use deltaq::model::mtp::MtpState;
use deltaq::model::{Drafter, KvType, Model, Session};
use deltaq::npy::{self, NpyArray};
use deltaq::quantize::FileType;
use deltaq::sampling::{Sampler, SamplingParams};
use deltaq::tokenizer::Tokenizer;
use sha2::{Digest, Sha256};

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

fn golden(name: &str) -> NpyArray {
    npy::read(&shared(&format!("tiny-kjv-mtp/golden/{name}"))).unwrap()
}

fn ids(a: &NpyArray) -> Vec<u32> {
    a.data.iter().map(|&t| t as u32).collect()
}

/// Our F32 conversion of the checkpoint, MTP block included; it must be llama.cpp's file byte for
/// byte (the fixture README gives its sha256).
fn f32_file(dir: &Path) -> GgufFile {
    let out = dir.join("tiny-kjv-mtp-F32.gguf");
    let opts = ConvertOptions {
        outtype: FileType::F32,
        no_mtp: false,
        model_name: Some("tiny-kjv-mtp".into()),
        overwrite: false,
        progress: false,
    };
    convert(&shared("tiny-kjv-mtp/hf"), &out, &opts).unwrap();
    let sha = Sha256::digest(std::fs::read(&out).unwrap());
    let hex: String = sha.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex, "49ac0776e41ba514ac5e8524e2659c20f2aa1b0aa4b564726ecc798a336826c9",
        "our F32 conversion differs from llama.cpp's"
    );
    GgufFile::open(&out).unwrap()
}

fn q8_file() -> GgufFile {
    GgufFile::open(shared("tiny-kjv-mtp/tiny-kjv-mtp-Q8_0.gguf")).unwrap()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// max |a − b| over a row, and the row's range.
fn err_and_range(a: &[f32], b: &[f32]) -> (f32, f32) {
    let err = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    let hi = b.iter().cloned().fold(f32::MIN, f32::max);
    let lo = b.iter().cloned().fold(f32::MAX, f32::min);
    (err, hi - lo)
}

/// The MTP block fed the golden trunk hidden states, teacher-forced over the 64-token prompt (row 0
/// with a zero hidden state): its logits at rows 1..63 against the float64 reference, within 1e-3 of
/// each row's logit range, and the same argmax.
#[test]
fn teacher_forced_logits_match_goldens() {
    let dir = tempfile::tempdir().unwrap();
    let f = f32_file(dir.path());
    let model = Model::load(&f).unwrap();
    let (d, v) = (model.hp.n_embd, model.n_vocab());
    let tokens = ids(&golden("tokens.npy"));
    let h = golden("trunk_hidden.npy").data;
    let want = golden("mtp_logits.npy").data;
    let acts = golden("mtp_activations.npy").data;
    // h_prev of row p is h_{p−1}; row 0 gets zeros.
    let mut h_prev = vec![0f32; d];
    h_prev.extend(h[..63 * d].iter().map(|&x| x as f32));
    for kv in [KvType::F16, KvType::F32] {
        let mut st = MtpState::new(&model, 128, kv).unwrap();
        let y = st.forward(&model, &tokens, &h_prev).unwrap().to_vec();
        // y (the block's output) against the reference's, all 64 rows.
        let y_want: Vec<f32> = acts[5 * 64 * d..6 * 64 * d]
            .iter()
            .map(|&x| x as f32)
            .collect();
        let (ey, ry) = err_and_range(&y, &y_want);
        let mut worst = 0f32;
        for t in 0..63 {
            let got = st
                .logits(&model, &y[(t + 1) * d..][..d], 0)
                .unwrap()
                .to_vec();
            let want: Vec<f32> = want[t * v..][..v].iter().map(|&x| x as f32).collect();
            let (err, range) = err_and_range(&got, &want);
            worst = worst.max(err / range);
            assert_eq!(argmax(&got), argmax(&want), "{kv}: argmax at row {}", t + 1);
        }
        eprintln!("{kv}: teacher-forced MTP logits max err {worst:.2e} of the range; y max err {ey:.2e} (range {ry:.2})");
        let bound = match kv {
            KvType::F32 => 1e-3,
            KvType::F16 => 2e-3,
            KvType::Q8_0 | KvType::Q4_0 => unreachable!("float types only"),
        };
        assert!(worst <= bound, "{kv}: {worst} of the range");
    }
}

/// Chained drafts from the goldens' starts: step 1 fed (x_{t+1}, h_t), later steps their own draft
/// and output; logits within 1e-3 of the range and the same draft tokens.
#[test]
fn chained_drafts_match_goldens() {
    let dir = tempfile::tempdir().unwrap();
    let f = f32_file(dir.path());
    let model = Model::load(&f).unwrap();
    let (d, v) = (model.hp.n_embd, model.n_vocab());
    let tokens = ids(&golden("tokens.npy"));
    let h: Vec<f32> = golden("trunk_hidden.npy")
        .data
        .iter()
        .map(|&x| x as f32)
        .collect();
    let starts = ids(&golden("chain_starts.npy"));
    let chain_tokens = ids(&golden("chain_tokens.npy"));
    let chain_logits = golden("chain_logits.npy").data;
    let mut worst = 0f32;
    for (i, &t) in starts.iter().enumerate() {
        let t = t as usize;
        let mut st = MtpState::new(&model, 128, KvType::F32).unwrap();
        // Teacher-forced rows 0..=t, then step 1 = row t+1 (x_{t+1}, h_t).
        let mut h_prev = vec![0f32; d];
        h_prev.extend_from_slice(&h[..t * d]);
        st.forward(&model, &tokens[..=t], &h_prev).unwrap();
        let (mut x, mut hp) = (tokens[t + 1], h[t * d..][..d].to_vec());
        for s in 0..3 {
            let y = st.forward(&model, &[x], &hp).unwrap().to_vec();
            let got = st.logits(&model, &y, 0).unwrap().to_vec();
            let want: Vec<f32> = chain_logits[(i * 3 + s) * v..][..v]
                .iter()
                .map(|&x| x as f32)
                .collect();
            let (err, range) = err_and_range(&got, &want);
            worst = worst.max(err / range);
            x = argmax(&got);
            assert_eq!(x, chain_tokens[i * 3 + s], "start {t}, step {}", s + 1);
            hp = y;
        }
    }
    eprintln!("chained MTP logits: max err {worst:.2e} of the range");
    assert!(worst <= 1e-3, "{worst} of the range");
}

/// The same chains through a session on our own trunk (F32 and llama.cpp's Q8_0 file): the prompt
/// fills the MTP cache as it runs, and `draft` gives the golden draft tokens.
#[test]
fn session_drafts_match_golden_chains() {
    let dir = tempfile::tempdir().unwrap();
    let files = [("F32", f32_file(dir.path())), ("Q8_0", q8_file())];
    let tokens = ids(&golden("tokens.npy"));
    let starts = ids(&golden("chain_starts.npy"));
    let chain_tokens = ids(&golden("chain_tokens.npy"));
    for (name, f) in &files {
        let model = Model::load(f).unwrap();
        for (i, &t) in starts.iter().enumerate() {
            let t = t as usize;
            let mut s = Session::new(&model, Some(256));
            s.enable_mtp().unwrap();
            s.feed(&tokens[..=t]).unwrap();
            let drafts = s.draft(tokens[t + 1], 3, 0.0, 0).unwrap();
            assert_eq!(drafts, &chain_tokens[i * 3..][..3], "{name}: start {t}");
        }
    }
}

/// The first five eval-john chapter openings (the fixture README's llama.cpp prompts).
fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(shared("text/eval-john.txt")).unwrap();
    let paras: Vec<&str> = text
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .collect();
    [0, 4, 8, 12, 16]
        .iter()
        .map(|&i| {
            let words: Vec<&str> = paras[i].split_whitespace().take(40).collect();
            tok.encode(&words.join(" "), false).unwrap()
        })
        .collect()
}

/// Greedy decoding of `n` tokens through `Session::step` (drafting as `drafter` says).
fn greedy(model: &Model, prompt: &[u32], n: usize, drafter: &mut Drafter) -> (Vec<u32>, u64) {
    greedy_kv(model, prompt, n, drafter, KvType::default())
}

/// [`greedy`] with the KV caches (the trunk's and the MTP block's) stored as `kv`.
fn greedy_kv(
    model: &Model,
    prompt: &[u32],
    n: usize,
    drafter: &mut Drafter,
    kv: KvType,
) -> (Vec<u32>, u64) {
    let mut s = Session::with_kv_type(model, Some(1024), kv);
    if drafter.n_max > 0 {
        s.enable_mtp().unwrap();
    }
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let mut logits = s.forward_last(prompt).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let id = sampler.sample(&logits);
        sampler.accept(id);
        out.push(id);
        logits = s.step(id, drafter).unwrap().to_vec();
    }
    s.settle().unwrap();
    assert_eq!(s.pos(), prompt.len() + n);
    (out, s.evaluated)
}

/// Greedy speculative decoding is plain greedy decoding, token for token, with 1, 2 and 3 drafts per
/// step, on the F32 and Q8_0 files; no token is computed twice (the trunk evaluates the prompt, every
/// generated token once, and the rejected drafts); and the acceptance on llama.cpp's five prompts
/// (128 tokens each) is at least llama.cpp's (Q8_0: 61.5 / 46.9 / 35.7 %).
#[test]
fn speculative_greedy_equals_plain() {
    let dir = tempfile::tempdir().unwrap();
    let files = [("F32", f32_file(dir.path())), ("Q8_0", q8_file())];
    for (name, f) in &files {
        let model = Model::load(f).unwrap();
        let tok = Tokenizer::from_gguf(f).unwrap();
        let prompts = prompts(&tok);
        let n = 128;
        let plain: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| greedy(&model, p, n, &mut Drafter::off()).0)
            .collect();
        for k in 1..=3 {
            let (mut proposed, mut accepted) = (0, 0);
            for (pi, (p, plain)) in prompts.iter().zip(&plain).enumerate() {
                let mut dr = Drafter::new(k, 0.0, 0, false);
                let (spec, evaluated) = greedy(&model, p, n, &mut dr);
                assert_eq!(&spec, plain, "{name}, {k} drafts, prompt {pi}");
                // Drafts are counted when proposed and when consumed, so the step in flight when
                // generation stopped counts its unconsumed drafts as rejected.
                let rejected = dr.stats.proposed - dr.stats.accepted;
                assert_eq!(
                    evaluated,
                    (p.len() + n) as u64 + rejected,
                    "{name}, {k} drafts, prompt {pi}: trunk evaluations"
                );
                proposed += dr.stats.proposed;
                accepted += dr.stats.accepted;
            }
            let rate = accepted as f64 / proposed as f64;
            eprintln!(
                "{name}: {k} drafts: {accepted}/{proposed} accepted ({:.1} %)",
                100.0 * rate
            );
            if *name == "Q8_0" {
                let llama = [0.615, 0.469, 0.357][k - 1];
                assert!(
                    rate >= llama - 0.005,
                    "{name}, {k}: {rate} < llama.cpp's {llama}"
                );
            }
        }
    }
}

/// A short version of the above for every kernel table under emulation (tools/test-aarch64.sh runs it
/// as a Cortex-A76): llama.cpp's Q8_0 file, two prompts × 48 tokens, 1 to 3 drafts per step.
#[test]
fn drafting_identity_q8_short() {
    let f = q8_file();
    let model = Model::load(&f).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    for p in prompts(&tok).iter().take(2) {
        let (plain, _) = greedy(&model, p, 48, &mut Drafter::off());
        for k in 1..=3 {
            let mut dr = Drafter::new(k, 0.0, 0, false);
            let (spec, _) = greedy(&model, p, 48, &mut dr);
            assert_eq!(spec, plain, "{k} drafts");
            assert!(dr.stats.accepted > 0, "{k} drafts: nothing accepted");
        }
    }
}

/// With Q8_0 and Q4_0 KV caches (the trunk's and the MTP block's), speculative greedy decoding is
/// still plain greedy decoding token for token: rolled-back drafts are cut from the quantized caches
/// exactly, and a verification pass sees the same cache as single steps.
#[test]
fn drafting_identity_quantized_kv() {
    let f = q8_file();
    let model = Model::load(&f).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    for kv in [KvType::Q8_0, KvType::Q4_0] {
        for p in prompts(&tok).iter().take(2) {
            let (plain, _) = greedy_kv(&model, p, 48, &mut Drafter::off(), kv);
            for k in 1..=3 {
                let mut dr = Drafter::new(k, 0.0, 0, false);
                let (spec, _) = greedy_kv(&model, p, 48, &mut dr, kv);
                assert_eq!(spec, plain, "{kv}, {k} drafts");
                assert!(dr.stats.accepted > 0, "{kv}, {k} drafts: nothing accepted");
            }
        }
    }
}
