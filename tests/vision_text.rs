//! The text model's side of image input on tiny-v1 (the fixture's Qwen3.5 vision-language model):
//! the golden vision-tower outputs (float64) injected in place of the `<|image_pad|>` rows, M-RoPE
//! positions against transformers' `get_rope_index`, logits of every position and the greedy
//! continuation against the strict float64 goldens; text alone unchanged; no MTP drafting once a
//! sequence holds an image (tiny-kjv-mtp).
//!
//! F32 GGUF with an F32 KV cache. The fixture README: llama.cpp, fed transformers' embeddings the same
//! way, lands within 3.6e-5 of the goldens.

use std::path::PathBuf;
use std::sync::Arc;

use deltaq::gguf::GgufFile;
use deltaq::model::prompt::{image_chat_prompt, MEDIA_MARKER};
use deltaq::model::{Drafter, ImageEmbd, KvType, Model, Prompt, Segment, Session};
use deltaq::npy::{self, NpyArray};
use deltaq::tokenizer::Tokenizer;

const IMAGE_PAD: u32 = 1036;

fn fixture(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/shared")
        .join(rel);
    assert!(
        p.exists(),
        "missing test fixture {}: run tools/fetch-fixtures.sh (copies it from ../shared/fixtures)",
        p.display()
    );
    p
}

fn golden(name: &str) -> NpyArray {
    npy::read(&fixture(&format!("tiny-v1/golden/{name}.npy"))).unwrap()
}

fn ids(a: &NpyArray) -> Vec<u32> {
    a.data.iter().map(|&t| t as u32).collect()
}

fn model_file() -> GgufFile {
    GgufFile::open(fixture("tiny-v1/tiny-v1-F32.gguf")).unwrap()
}

/// Image `i`'s golden tower output as the embeddings of its merged grid (`grid_thw` / 2).
fn image(i: usize) -> Arc<ImageEmbd> {
    let grid = golden(&format!("img{i}_grid_thw"));
    assert_eq!(grid.shape, [1, 3]);
    let (rows, cols) = (grid.data[1] as usize / 2, grid.data[2] as usize / 2);
    let out = golden(&format!("img{i}_vision_out_f64"));
    assert_eq!(out.shape[0], rows * cols);
    let embd = out.data.iter().map(|&x| x as f32).collect();
    Arc::new(ImageEmbd::new(embd, rows, cols).unwrap())
}

/// Chat `c`'s prompt (image `c`) from its golden token ids.
fn chat_prompt(c: usize) -> Prompt {
    let toks = ids(&golden(&format!("chat{c}_input_ids")));
    Prompt::from_tokens(toks, IMAGE_PAD, [image(c)]).unwrap()
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len())
        .max_by(|&i, &j| row[i].total_cmp(&row[j]))
        .unwrap() as u32
}

/// Per position against a float64 golden: (max |Δlogit|, that / the golden logit range).
fn logit_errors(logits: &[f32], gold: &NpyArray) -> Vec<(f64, f64)> {
    let v = gold.shape[1];
    assert_eq!(logits.len(), gold.data.len(), "logits shape");
    logits
        .chunks_exact(v)
        .zip(gold.data.chunks_exact(v))
        .map(|(row, g)| {
            let d = row
                .iter()
                .zip(g)
                .map(|(x, y)| (*x as f64 - y).abs())
                .fold(0.0, f64::max);
            let range = g.iter().copied().fold(f64::MIN, f64::max)
                - g.iter().copied().fold(f64::MAX, f64::min);
            (d, d / range)
        })
        .collect()
}

/// Logits position by position against a float64 golden: max |Δ| ≤ 1e-3 × the golden logit range of
/// that position. Returns (max |Δ|, max |Δ| / range).
fn check_logits(label: &str, logits: &[f32], gold: &NpyArray) -> (f64, f64) {
    let (mut worst, mut worst_rel) = (0f64, 0f64);
    for (p, (d, rel)) in logit_errors(logits, gold).into_iter().enumerate() {
        assert!(
            rel <= 1e-3,
            "{label}: position {p}: max |Δlogit| {d:.3e} = {rel:.3e} of the range (> 1e-3)"
        );
        worst = worst.max(d);
        worst_rel = worst_rel.max(rel);
    }
    eprintln!("{label}: max |Δlogit| {worst:.3e} ({worst_rel:.3e} of the range)");
    (worst, worst_rel)
}

/// Greedy continuation of `n` tokens after `last` (the prompt's last logits): argmax, no EOS stop,
/// each token fed as text at the session's next position.
fn greedy(s: &mut Session, last: &[f32], n: usize) -> Vec<u32> {
    let mut out = vec![argmax(last)];
    while out.len() < n {
        let id = *out.last().unwrap();
        out.push(argmax(s.forward_last_ref(&[id]).unwrap()));
    }
    out
}

#[test]
fn positions_equal_get_rope_index() {
    for c in 0..3 {
        let p = chat_prompt(c);
        let gold = golden(&format!("chat{c}_position_ids")); // [3 × T]
        let t = p.len();
        assert_eq!(gold.shape, [3, t]);
        for (i, pos) in p.positions().iter().enumerate() {
            let want = [0, 1, 2].map(|a| gold.data[a * t + i] as u32);
            assert_eq!(*pos, want, "chat{c}: position of token {i}");
        }
        // rope_delta = max position + 1 − T (README: −60, −60, −66): where generation continues.
        let max = gold.data.iter().copied().fold(0.0, f64::max) as usize;
        assert_eq!(p.next_position(t), max + 1, "chat{c}: next position");
        eprintln!(
            "chat{c}: {t} tokens, positions exact, rope delta {}",
            max as i64 + 1 - t as i64
        );
    }
}

/// Every position's logits of the three image prompts in one batch, and the greedy continuation.
#[test]
fn image_prompts_match_golden() {
    let f = model_file();
    let m = Model::load(&f).unwrap();
    let mut worst = (0f64, 0f64);
    for c in 0..3 {
        let p = chat_prompt(c);
        let mut s = Session::with_kv_type(&m, None, KvType::F32);
        let logits = s.forward_prompt(&p, 0..p.len()).unwrap();
        let (a, r) = check_logits(
            &format!("chat{c} batch"),
            &logits,
            &golden(&format!("chat{c}_logits_f64")),
        );
        worst = (worst.0.max(a), worst.1.max(r));
        assert!(s.has_image());
        assert_eq!(s.pos(), p.len());
        assert_eq!(s.rope_pos(), p.next_position(p.len()));

        let v = m.n_vocab();
        let got = greedy(&mut s, &logits[logits.len() - v..], 8);
        let want = ids(&golden(&format!("chat{c}_greedy")));
        assert_eq!(got, want, "chat{c}: greedy continuation");
        eprintln!("chat{c}: greedy {got:?} = transformers'");
    }
    eprintln!(
        "image prompts: max |Δlogit| {:.3e} ({:.3e} of the range)",
        worst.0, worst.1
    );
}

/// The tolerance sees the positions: chat 0 with its image declared as a 10 × 7 grid instead of
/// 7 × 10 (the same 70 rows in the same order, the text after it at the same position; only the
/// image rows' h and w change) misses the goldens by more than the 1e-3 of the range the tests allow
/// (measured 3.8e-3, against 2.5e-6 with the right grid).
#[test]
fn wrong_positions_fail() {
    let f = model_file();
    let m = Model::load(&f).unwrap();
    let im = image(0);
    let (rows, cols) = im.grid();
    let embd: Vec<f32> = (0..im.n_tokens())
        .flat_map(|r| im.row(r).to_vec())
        .collect();
    let transposed = Arc::new(ImageEmbd::new(embd, cols, rows).unwrap());
    let toks = ids(&golden("chat0_input_ids"));
    let p = Prompt::from_tokens(toks, IMAGE_PAD, [transposed]).unwrap();
    let logits = Session::with_kv_type(&m, None, KvType::F32)
        .forward_prompt(&p, 0..p.len())
        .unwrap();
    let worst = logit_errors(&logits, &golden("chat0_logits_f64"))
        .into_iter()
        .map(|e| e.1)
        .fold(0.0, f64::max);
    eprintln!("chat0 with the grid transposed: {worst:.3e} of the range");
    assert!(worst > 2e-3, "transposed grid: {worst:.3e}");
}

/// The prompt fed in pieces that cut the image (one token at a time for chat 0, uneven chunks for
/// chat 2), with a snapshot taken midway: the same logits, within the same tolerance.
#[test]
fn image_prompt_in_pieces() {
    let f = model_file();
    let m = Model::load(&f).unwrap();
    let v = m.n_vocab();

    let p = chat_prompt(0);
    let mut s = Session::with_kv_type(&m, None, KvType::F32);
    let mut logits = Vec::new();
    for i in 0..p.len() {
        logits.extend(s.forward_prompt(&p, i..i + 1).unwrap());
    }
    check_logits("chat0 token by token", &logits, &golden("chat0_logits_f64"));

    let p = chat_prompt(2);
    let gold = golden("chat2_logits_f64");
    let mut s = Session::with_kv_type(&m, None, KvType::F32);
    let mut logits = s.forward_prompt(&p, 0..3).unwrap();
    logits.extend(s.forward_prompt(&p, 3..40).unwrap());
    let snap = s.clone();
    logits.extend(s.forward_prompt(&p, 40..p.len()).unwrap());
    check_logits("chat2 in chunks 3/37/57", &logits, &gold);
    let mut s2 = snap;
    let last = s2.forward_prompt_last(&p, 40..p.len()).unwrap().to_vec();
    assert_eq!(&last[..], &logits[logits.len() - v..], "snapshot resumed");
    let got = greedy(&mut s2, &last, 8);
    assert_eq!(
        got,
        ids(&golden("chat2_greedy")),
        "chat2 greedy after a snapshot"
    );

    // A range must continue the session's sequence.
    let mut s3 = Session::with_kv_type(&m, None, KvType::F32);
    let e = s3.feed_prompt(&p, 5..10).unwrap_err();
    assert!(e.to_string().contains("starts at token 5"), "{e}");
    let e = s3.feed_prompt(&p, 0..p.len() + 1).unwrap_err();
    assert!(e.to_string().contains("outside"), "{e}");
    // Tokens fed as plain text before the image are the prompt's prefix; text fed after them is not
    // at the image's positions, so a prompt cannot continue such a session.
    s3.feed(&p.tokens()[..5]).unwrap();
    s3.feed_prompt(&p, 5..10).unwrap();
    let mut s4 = Session::with_kv_type(&m, None, KvType::F32);
    s4.feed_prompt(&p, 0..10).unwrap();
    s4.feed(&[1, 2]).unwrap();
    let e = s4
        .feed_prompt(&Prompt::text(vec![0; 20]).unwrap(), 12..13)
        .unwrap_err();
    assert!(e.to_string().contains("positions"), "{e}");
}

/// The chat prompts from the text `Describe.` and the images, as llama-mtmd-cli builds them: the golden
/// token ids.
#[test]
fn chat_prompt_tokens() {
    let f = model_file();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    for c in 0..3 {
        let want = chat_prompt(c);
        let p = image_chat_prompt(&tok, "Describe.", vec![image(c)]).unwrap();
        assert_eq!(p.tokens(), want.tokens(), "chat{c}");
        assert_eq!(p.positions(), want.positions(), "chat{c}");
        let marked = format!("{MEDIA_MARKER}Describe.");
        let q = image_chat_prompt(&tok, &marked, vec![image(c)]).unwrap();
        assert_eq!(q.tokens(), want.tokens(), "chat{c} with the marker");
    }
    let e = image_chat_prompt(&tok, "Describe.", vec![]).map(|p| p.len());
    assert!(e.is_ok(), "no image: a text prompt");
    let two = format!("{MEDIA_MARKER} and {MEDIA_MARKER}");
    let e = image_chat_prompt(&tok, &two, vec![image(0)]).unwrap_err();
    assert!(e.to_string().contains("2 image markers"), "{e}");
}

/// The text-only prompt: bit-identical through `forward` and through a text `Prompt`, and within
/// tolerance of transformers' logits.
#[test]
fn text_prompt_unchanged() {
    let f = model_file();
    let m = Model::load(&f).unwrap();
    let toks = ids(&golden("text_input_ids"));
    let plain = Session::with_kv_type(&m, None, KvType::F32)
        .forward(&toks)
        .unwrap();
    check_logits("text-only", &plain, &golden("text_logits_f64"));
    let p = Prompt::text(toks.clone()).unwrap();
    let mut s = Session::with_kv_type(&m, None, KvType::F32);
    let via_prompt = s.forward_prompt(&p, 0..p.len()).unwrap();
    assert_eq!(plain, via_prompt, "text through a Prompt");
    assert!(!s.has_image());
    assert_eq!(s.rope_pos(), toks.len());
}

/// The logits after each of `n` greedy steps through `Session::step` after prompt `p`.
fn decode(s: &mut Session, p: &Prompt, dr: &mut Drafter, n: usize) -> Vec<Vec<f32>> {
    let mut logits = s.forward_prompt_last(p, 0..p.len()).unwrap().to_vec();
    let mut all = Vec::new();
    for _ in 0..n {
        let id = argmax(&logits);
        logits = s.step(id, dr).unwrap().to_vec();
        all.push(logits.clone());
    }
    s.settle().unwrap();
    all
}

/// tiny-kjv-mtp (trunk + MTP block, same M-RoPE sections): a session that drafts on text turns
/// drafting off once an image is fed, and then decodes exactly as a plain session; after `clear` it
/// drafts again.
#[test]
fn image_session_does_not_draft() {
    let f = GgufFile::open(fixture("tiny-kjv-mtp/tiny-kjv-mtp-Q8_0.gguf")).unwrap();
    let m = Model::load(&f).unwrap();
    let d = m.hp.n_embd;
    // A 3 × 4 "image" of smooth pseudo-random embeddings, 12 rows.
    let embd: Vec<f32> = (0..12 * d)
        .map(|i| ((i * 7919 % 997) as f32 / 997.0 - 0.5) * 2.0)
        .collect();
    let image = Arc::new(ImageEmbd::new(embd, 3, 4).unwrap());
    let p = Prompt::new([
        Segment::Text(vec![10, 20, 30]),
        Segment::Image {
            image,
            pad_token: 5,
        },
        Segment::Text(vec![40, 50, 60, 70]),
    ])
    .unwrap();
    let n = 24;
    let mut plain = Session::new(&m, Some(256));
    let want = decode(&mut plain, &p, &mut Drafter::off(), n);

    let mut s = Session::new(&m, Some(256));
    s.enable_mtp().unwrap();
    let mut dr = Drafter::new(3, 0.0, 0, false);
    let got = decode(&mut s, &p, &mut dr, n);
    assert_eq!(
        got, want,
        "steps of a sequence with an image are plain steps"
    );
    assert_eq!(dr.stats.proposed, 0);
    assert!(s.draft(1, 2, 0.0, 0).is_err());
    assert_eq!(s.evaluated, (p.len() + n) as u64);

    // Cleared, the same session drafts again on text.
    s.clear();
    assert!(!s.has_image());
    let mut logits = s.forward_last(&[10, 20, 30, 40, 50]).unwrap();
    let mut dr = Drafter::new(3, 0.0, 0, false);
    for _ in 0..n {
        logits = s.step(argmax(&logits), &mut dr).unwrap().to_vec();
    }
    assert!(dr.stats.proposed > 0, "text drafts after clear");
}
