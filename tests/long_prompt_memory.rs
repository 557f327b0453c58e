//! A long prompt's heap peak does not scale with prompt length × vocabulary or prompt length × the
//! activations' width: prefill runs in ubatches ([`deltaq::model::UBATCH`] tokens) and keeps only the
//! last position's logits. On the demo model a 4,000-token prompt's logits for every position would be
//! 66 MB; what a prefill may hold is its state (the KV cache of the tokens fed, the recurrent states)
//! plus one ubatch's scratch. The heap is counted by `peak_alloc`'s global allocator (the system's, counted).

use std::sync::Mutex;

use deltaq::gguf::GgufFile;
use deltaq::model::{Drafter, KvType, Model, Session};
use peak_alloc::PeakAlloc;

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/tiny-kjv-mtp-Q8_0.gguf");

/// The system allocator, counting the bytes live and the most since the last reset.
#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

/// The tests of this file measure one at a time (the counters are process-wide).
static SERIAL: Mutex<()> = Mutex::new(());

/// Restarts the peak at the bytes live now and returns them.
fn reset_peak() -> usize {
    ALLOC.reset_peak_usage();
    ALLOC.current_usage()
}

fn peak() -> usize {
    ALLOC.peak_usage()
}

/// `n` token ids spread over the vocabulary (the memory does not depend on which).
fn tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % n_vocab) as u32).collect()
}

const N_PROMPT: usize = 4000;
/// One ubatch's activations and the kernels' buffers on the demo model (d = 256, FFN 768) take
/// about 4 MB; the margin covers the thread pool's and the allocator's own.
const SCRATCH_BOUND: usize = 12 << 20;

/// Peak heap growth over a prefill of `N_PROMPT` tokens in `s` (last logits only, or every position's),
/// and the bytes of state `s` holds at the end.
fn prefill_peak(s: &mut Session, n_vocab: usize, last_only: bool) -> (usize, usize) {
    let toks = tokens(N_PROMPT, n_vocab);
    let base = reset_peak();
    let logits = if last_only {
        s.forward_last(&toks).unwrap()
    } else {
        s.forward(&toks).unwrap()
    };
    let grown = peak() - base;
    let want = if last_only {
        n_vocab
    } else {
        N_PROMPT * n_vocab
    };
    assert_eq!(logits.len(), want);
    drop(logits);
    (grown, s.state_bytes())
}

#[test]
fn prefill_keeps_one_logits_row_and_one_ubatch_of_scratch() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = GgufFile::open(MODEL).unwrap();
    let model = Model::load(&f).unwrap();
    let n_vocab = model.n_vocab();
    let all_logits = N_PROMPT * n_vocab * 4;
    for kv in [KvType::F16, KvType::Q8_0] {
        let mut s = Session::with_kv_type(&model, Some(4096), kv);
        let (grown, state) = prefill_peak(&mut s, n_vocab, true);
        assert!(
            grown <= state + SCRATCH_BOUND,
            "{kv:?}: a {N_PROMPT}-token prefill peaked at {grown} B over its start, holding a \
             {state}-byte state (bound: state + {SCRATCH_BOUND}; all logits rows would be {all_logits})"
        );
    }
    // The check can fail: asking for every position's logits does cross the bound.
    let mut s = Session::new(&model, Some(4096));
    let (grown, state) = prefill_peak(&mut s, n_vocab, false);
    assert!(
        grown > state + SCRATCH_BOUND,
        "{grown} B for all logits rows"
    );
}

#[test]
fn prefill_with_drafting_on_stays_bounded() {
    // With the MTP block on, every prompt position's hidden row feeds the block's own KV cache: those
    // rows are flushed in groups, never held for the whole prompt.
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = GgufFile::open(MODEL).unwrap();
    let model = Model::load(&f).unwrap();
    let n_vocab = model.n_vocab();
    let mut s = Session::new(&model, Some(4096));
    s.enable_mtp().unwrap();
    let (grown, state) = prefill_peak(&mut s, n_vocab, true);
    assert!(
        grown <= state + SCRATCH_BOUND,
        "drafting on: a {N_PROMPT}-token prefill peaked at {grown} B, state {state} B"
    );
    // And a decoding step after it stays within the same bound.
    let mut dr = Drafter::off();
    let base = reset_peak();
    s.step(1, &mut dr).unwrap();
    assert!(peak() - base <= SCRATCH_BOUND);
}
