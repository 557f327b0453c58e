//! Speed and memory measurement as llama.cpp's `llama-bench` does it, so the two can be compared
//! number for number (`deltaq bench`, `tools/bench-vs-llama.sh`).
//!
//! * A **pp** test processes an `n_prompt`-token prompt of random token ids from an empty state, in one
//!   call (logits of the last position only); a **tg** test feeds `n_gen` random tokens one at a time
//!   from an empty state, each with its logits. A test is repeated `reps` times after a warm-up run
//!   (the whole prompt, or one generated token) on one session, cleared ([`Session::clear`]) outside
//!   the timed part, which keeps its buffers as llama-bench keeps its context's.
//! * At a depth `d` (llama-bench's `-d`, `n_depth`), every repetition starts from a sequence already
//!   holding `d` random tokens: they are fed once, untimed, and each repetition goes back to that
//!   state ([`Session::rewind_to`]) as llama-bench restores its saved state of the depth run.
//! * Speed per repetition is tokens / seconds; the mean and the sample standard deviation are
//!   llama-bench's `avg_ts` and `stddev_ts`, and the median is ours.
//! * The bytes of weights read per decoded token are every tensor of the trunk, except that only one
//!   row of the token-embedding table is read unless it doubles as the LM head (tied embeddings).
//!   Divided by the time per token this gives the achieved weight bandwidth of decoding, to set
//!   against [`read_bandwidth`], a streaming read over a buffer much larger than the caches.

use std::time::Instant;

use anyhow::{bail, Result};
use rayon::prelude::*;

use crate::gguf::GgufFile;
use crate::kernels;
use crate::model::{KvType, Model, Session};

/// What a test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestKind {
    /// Prompt processing of `n` tokens.
    Prompt(usize),
    /// Generation of `n` tokens, one at a time.
    Gen(usize),
}

impl TestKind {
    /// `pp512` / `tg128`, as llama-bench names them.
    pub fn name(self) -> String {
        match self {
            TestKind::Prompt(n) => format!("pp{n}"),
            TestKind::Gen(n) => format!("tg{n}"),
        }
    }

    pub fn n_tokens(self) -> usize {
        match self {
            TestKind::Prompt(n) | TestKind::Gen(n) => n,
        }
    }
}

/// The outcome of one test.
#[derive(Clone, Debug)]
pub struct TestResult {
    pub kind: TestKind,
    /// Tokens in the sequence before each repetition (llama-bench's `n_depth`).
    pub n_depth: usize,
    /// Wall time of each repetition.
    pub samples_ns: Vec<u64>,
    /// Bytes of the sequence state after a repetition: KV cache and recurrent (conv + delta-rule) state.
    pub kv_bytes: usize,
    pub recurrent_bytes: usize,
}

impl TestResult {
    /// `pp512`, or `pp512 @ d4096` at a depth, as llama-bench names its tests.
    pub fn name(&self) -> String {
        match self.n_depth {
            0 => self.kind.name(),
            d => format!("{} @ d{d}", self.kind.name()),
        }
    }

    /// Tokens per second of each repetition.
    pub fn samples_ts(&self) -> Vec<f64> {
        let n = self.kind.n_tokens() as f64;
        self.samples_ns
            .iter()
            .map(|&t| n * 1e9 / (t.max(1) as f64))
            .collect()
    }
    pub fn avg_ts(&self) -> f64 {
        mean(&self.samples_ts())
    }
    pub fn stddev_ts(&self) -> f64 {
        stddev(&self.samples_ts())
    }
    pub fn median_ts(&self) -> f64 {
        median(&self.samples_ts())
    }
    pub fn avg_ns(&self) -> f64 {
        let v: Vec<f64> = self.samples_ns.iter().map(|&t| t as f64).collect();
        mean(&v)
    }
    pub fn stddev_ns(&self) -> f64 {
        let v: Vec<f64> = self.samples_ns.iter().map(|&t| t as f64).collect();
        stddev(&v)
    }
}

pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// The sample standard deviation (n − 1), 0 for fewer than two values (llama-bench's `stdev`).
pub fn stddev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Random token ids (SplitMix64), like llama-bench's `rand() % n_vocab`.
struct TokenRng(u64);

impl TokenRng {
    fn next(&mut self, n_vocab: usize) -> u32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z % n_vocab as u64) as u32
    }
}

/// How a test runs besides its kind.
#[derive(Clone, Copy, Debug)]
pub struct TestSetup {
    pub reps: usize,
    /// Context size of each repetition's sequence.
    pub n_ctx: usize,
    /// Random tokens fed (untimed) before each repetition; only [`run_test`] reads it.
    pub n_depth: usize,
    pub kv_type: KvType,
    /// One untimed run first.
    pub warmup: bool,
    /// Seed of the random token ids.
    pub seed: u64,
}

/// Runs one test in the current rayon pool: `warmup` untimed run(s) from an empty sequence, then
/// `reps` timed ones, each from a sequence holding the same `n_depth` random tokens, in a context of
/// `n_ctx` tokens.
pub fn run_test(model: &Model, kind: TestKind, setup: &TestSetup) -> Result<TestResult> {
    let &TestSetup {
        reps,
        n_ctx,
        n_depth,
        kv_type,
        warmup,
        seed,
    } = setup;
    let n = kind.n_tokens();
    if n == 0 {
        bail!("a test needs at least one token");
    }
    if n_depth + n > n_ctx {
        bail!(
            "{} at depth {n_depth} needs a context of {} tokens, but the context size is {n_ctx}",
            kind.name(),
            n_depth + n
        );
    }
    let n_vocab = model.n_vocab();
    let mut rng = TokenRng(seed);
    // One session per test, cleared between runs (as llama-bench clears its context's memory): its
    // buffers are allocated by the first run, not inside every timed one.
    let mut s = Session::with_kv_type(model, Some(n_ctx), kv_type);
    if warmup {
        s.clear();
        timed_run(&mut s, kind, &mut rng, n_vocab, false)?;
    }
    // The state every repetition starts from: empty, or `n_depth` tokens (fed once, untimed).
    s.clear();
    let at_depth = if n_depth > 0 {
        let fill: Vec<u32> = (0..n_depth).map(|_| rng.next(n_vocab)).collect();
        s.feed(&fill)?;
        Some(s.clone())
    } else {
        None
    };
    let mut r = TestResult {
        kind,
        n_depth,
        samples_ns: Vec::with_capacity(reps),
        kv_bytes: 0,
        recurrent_bytes: 0,
    };
    for _ in 0..reps {
        match &at_depth {
            Some(d) => s.rewind_to(d)?,
            None => s.clear(),
        }
        r.samples_ns
            .push(timed_run(&mut s, kind, &mut rng, n_vocab, true)?);
        (r.kv_bytes, r.recurrent_bytes) = s.state_parts();
    }
    Ok(r)
}

/// One run of `kind` on `s` with random ids below `n_vocab`, in nanoseconds: the whole prompt, or `n`
/// generated tokens (one when not `full`: a warm-up).
fn timed_run(
    s: &mut Session,
    kind: TestKind,
    rng: &mut TokenRng,
    n_vocab: usize,
    full: bool,
) -> Result<u64> {
    let prompt: Vec<u32> = match kind {
        TestKind::Prompt(n) => (0..n).map(|_| rng.next(n_vocab)).collect(),
        TestKind::Gen(_) => Vec::new(),
    };
    let t0 = Instant::now();
    match kind {
        TestKind::Prompt(_) => {
            s.forward_last(&prompt)?;
        }
        TestKind::Gen(n) => {
            let n = if full { n } else { 1 };
            let mut tok = rng.next(n_vocab);
            for _ in 0..n {
                s.forward_last_ref(&[tok])?;
                tok = rng.next(n_vocab);
            }
        }
    }
    Ok(t0.elapsed().as_nanos() as u64)
}

/// Sizes of a model file, as llama-bench reports them and as decoding reads them.
#[derive(Clone, Copy, Debug)]
pub struct WeightSizes {
    /// Bytes of all tensors in the file (llama-bench's `model_size`).
    pub file_tensor_bytes: u64,
    /// Elements of all tensors in the file (`model_n_params`).
    pub n_params: u64,
    /// Bytes of weights one decoded token reads: every trunk tensor (not the MTP block), the token
    /// embedding table only as one row unless it is also the LM head.
    pub bytes_per_token: u64,
}

pub fn weight_sizes(f: &GgufFile, model: &Model) -> WeightSizes {
    let n_layer = model.hp.n_layer;
    let tied = f.tensor("output.weight").is_none();
    let mut s = WeightSizes {
        file_tensor_bytes: 0,
        n_params: 0,
        bytes_per_token: 0,
    };
    for t in f.tensors() {
        s.file_tensor_bytes += t.nbytes;
        s.n_params += t.n_elements();
        let read = if t.name == "token_embd.weight" {
            if tied {
                t.nbytes
            } else {
                t.nbytes / t.n_rows().max(1)
            }
        } else if let Some(rest) = t.name.strip_prefix("blk.") {
            let il = rest.split('.').next().and_then(|s| s.parse::<usize>().ok());
            match il {
                Some(il) if il < n_layer => t.nbytes,
                _ => 0, // the MTP block: never read by plain decoding
            }
        } else if t.name.starts_with("output") {
            t.nbytes
        } else {
            0
        };
        s.bytes_per_token += read;
    }
    s
}

/// Best read bandwidth in bytes/s of `passes` rounds of parallel streaming reads over a `bytes`-sized
/// buffer, split evenly over the threads of the current rayon pool; each round reads it both ways
/// ([`kernels::sum_words`] and [`kernels::sum_words_streamed`]).
pub fn read_bandwidth(bytes: usize, passes: usize) -> f64 {
    let n = (bytes / 8).max(1 << 12);
    let Ok(map) = sum_buffer(n) else {
        return 0.0;
    };
    let buf: &[u64] = bytemuck::cast_slice(&map[..]);
    let threads = rayon::current_num_threads().max(1);
    let chunk = n.div_ceil(threads);
    let mut best = 0f64;
    // Each pass reads the buffer twice, as one plain stream per thread and as the decode kernels read
    // weights (four streams with software prefetch on x86-64), which can be the faster of the two.
    for pass in 0..2 * passes.max(1) {
        let read = if pass % 2 == 0 {
            kernels::sum_words
        } else {
            kernels::sum_words_streamed
        };
        let t0 = Instant::now();
        let sum: u64 = buf
            .par_chunks(chunk)
            .map(read)
            .reduce(|| 0, u64::wrapping_add);
        let secs = t0.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        best = best.max((n * 8) as f64 / secs.max(1e-9));
    }
    best
}

/// An anonymous mapping of `bytes`, advised for transparent huge pages as the model's weights are (see
/// `GgufFile::open`): what speed probes stream from, since with 4 KiB pages TLB misses alone slow a
/// streaming read by up to 2× on a VM.
pub fn huge_region(bytes: usize) -> std::io::Result<memmap2::MmapMut> {
    let map = memmap2::MmapMut::map_anon(bytes)?;
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    Ok(map)
}

/// [`huge_region`] of `words` u64, each written once (its index) so every page is real memory, not the
/// shared zero page: the buffer of the read-bandwidth probes.
pub fn sum_buffer(words: usize) -> std::io::Result<memmap2::MmapMut> {
    let mut map = huge_region(words * 8)?;
    let buf: &mut [u64] = bytemuck::cast_slice_mut(&mut map[..]);
    for (i, w) in buf.iter_mut().enumerate() {
        *w = i as u64;
    }
    Ok(map)
}

/// The share of the resident part of the mapping that holds `addr` which is mapped with 2 MiB pages
/// (`FilePmdMapped` + `AnonHugePages` over `Rss` in /proc/self/smaps), or `None` where that is not known
/// (not Linux, or nothing resident).
pub fn huge_page_share(addr: usize) -> Option<f64> {
    let fields = mapping_kb(addr)?;
    let kb = |name: &str| fields.iter().find(|(n, _)| n == name).map_or(0, |f| f.1);
    let (rss, huge) = (kb("Rss"), kb("FilePmdMapped") + kb("AnonHugePages"));
    (rss > 0).then(|| huge as f64 / rss as f64)
}

/// The `kB` fields (`Rss`, `AnonHugePages`, ...) of the mapping that holds `addr`, from
/// /proc/self/smaps; `None` where no mapping holds it or there is no such file (not Linux).
pub fn mapping_kb(addr: usize) -> Option<Vec<(String, u64)>> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut fields = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                if fields.is_some() {
                    break; // the VMA after ours
                }
                if (lo..hi).contains(&addr) {
                    fields = Some(Vec::new());
                }
                continue;
            }
        }
        let (Some(fields), Some((name, rest))) = (fields.as_mut(), line.split_once(':')) else {
            continue;
        };
        if let Some(kb) = rest.trim().strip_suffix("kB") {
            if let Ok(kb) = kb.trim().parse() {
                fields.push((name.to_string(), kb));
            }
        }
    }
    fields
}

/// A `kB` field of `/proc/self/status` (e.g. `VmHWM`, the peak resident set), in bytes; `None` where
/// the file does not exist (not Linux).
pub fn proc_status_bytes(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// Peak resident set size of this process so far (VmHWM), in bytes.
pub fn peak_rss() -> Option<u64> {
    proc_status_bytes("VmHWM")
}

/// The CPU's model name (`/proc/cpuinfo`), or the architecture.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                matches!(k.trim(), "model name" | "Model" | "Hardware")
                    .then(|| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_like_llama_bench() {
        let v = [10.0, 12.0, 11.0, 30.0];
        assert_eq!(mean(&v), 15.75);
        assert_eq!(median(&v), 11.5);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        let sd = stddev(&v);
        assert!((sd - (272.75f64 / 3.0).sqrt()).abs() < 1e-9, "{sd}");
        assert_eq!(stddev(&[5.0]), 0.0);
    }

    #[test]
    fn bandwidth_is_positive_and_sums_are_exact() {
        assert_eq!(kernels::sum_words(&(1..=20).collect::<Vec<u64>>()), 210);
        assert!(read_bandwidth(1 << 20, 2) > 0.0);
    }

    #[test]
    fn huge_page_share_is_a_fraction_of_a_resident_mapping() {
        let mut map = memmap2::MmapMut::map_anon(8 << 20).unwrap();
        map.fill(1);
        let h = huge_page_share(map.as_ptr() as usize + 12345);
        if cfg!(target_os = "linux") {
            let h = h.expect("no smaps entry for a resident mapping");
            assert!((0.0..=1.0).contains(&h), "{h}");
        }
        // An address no mapping holds.
        assert_eq!(huge_page_share(8), None);
    }
}

/// Costs of self-speculative decoding with `k` drafts per step, medians of `reps` runs at a depth of
/// `depth` tokens: a 1-token decode step, a (k+1)-token verification pass with the rollback of its
/// rejected drafts (all of them, as random weights reject them: the state after the first token is
/// put back), and drafting `k` tokens with the MTP block. Random weights accept no drafts, so the
/// verification's cost relative to a plain step is what a bench can say about the speed-up: a step
/// whose drafts are accepted at the pooled rate `r` (accepted / drafted) yields `1 + k·r` tokens.
#[derive(Clone, Copy, Debug)]
pub struct DraftCosts {
    pub k: usize,
    pub plain_ns: f64,
    pub verify_ns: f64,
    pub draft_ns: f64,
}

impl DraftCosts {
    /// Verification pass / plain step.
    pub fn verify_ratio(&self) -> f64 {
        self.verify_ns / self.plain_ns
    }

    /// (Drafting + verification) / plain step: the cost of a speculative step.
    pub fn step_ratio(&self) -> f64 {
        (self.verify_ns + self.draft_ns) / self.plain_ns
    }

    /// Projected speed-up over plain decoding when drafts are accepted at the pooled rate `r`.
    pub fn speedup(&self, r: f64) -> f64 {
        (1.0 + self.k as f64 * r) / self.step_ratio()
    }
}

pub fn draft_costs(model: &Model, k: usize, depth: usize, setup: &TestSetup) -> Result<DraftCosts> {
    let n_vocab = model.n_vocab();
    let mut rng = TokenRng(setup.seed);
    let mut s = Session::with_kv_type(model, Some(depth + k + 2), setup.kv_type);
    s.enable_mtp()?;
    let prompt: Vec<u32> = (0..depth).map(|_| rng.next(n_vocab)).collect();
    s.forward_last(&prompt)?;
    let at_depth = s.clone();
    let vocab = crate::model::mtp::default_vocab(model);
    let (mut plain, mut verify, mut draft) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..=setup.reps {
        let toks: Vec<u32> = (0..=k).map(|_| rng.next(n_vocab)).collect();
        // Each measurement starts from the same `depth`-token state: a plain step and a
        // verification are rolled back (the plain step by a 1-token verification), the drafts cut.
        let t0 = Instant::now();
        s.forward_last_ref(&toks[..1])?;
        let t_plain = t0.elapsed().as_nanos() as f64;
        s.rewind_to(&at_depth)?;
        let t0 = Instant::now();
        s.verify(&toks)?;
        s.settle()?;
        let t_verify = t0.elapsed().as_nanos() as f64;
        s.rewind_to(&at_depth)?;
        let t0 = Instant::now();
        s.draft(toks[0], k, 0.0, vocab)?;
        let t_draft = t0.elapsed().as_nanos() as f64;
        s.rewind_to(&at_depth)?;
        if i > 0 || !setup.warmup {
            plain.push(t_plain);
            verify.push(t_verify);
            draft.push(t_draft);
        }
    }
    Ok(DraftCosts {
        k,
        plain_ns: median(&plain),
        verify_ns: median(&verify),
        draft_ns: median(&draft),
    })
}

/// Generation of `n` tokens with drafting (`k` drafts per step, not adaptive), each token the
/// greedy choice of the model (so that drafts can be accepted), from a 1-token prompt: speed and
/// the draft counts.
pub fn spec_gen(
    model: &Model,
    k: usize,
    n: usize,
    setup: &TestSetup,
) -> Result<(TestResult, crate::model::DraftStats)> {
    use crate::sampling::{Sampler, SamplingParams};
    let n_vocab = model.n_vocab();
    let mut rng = TokenRng(setup.seed);
    let mut s = Session::with_kv_type(model, Some(n + 2), setup.kv_type);
    s.enable_mtp()?;
    let vocab = crate::model::mtp::default_vocab(model);
    let mut stats = crate::model::DraftStats::default();
    let mut r = TestResult {
        kind: TestKind::Gen(n),
        n_depth: 0,
        samples_ns: Vec::with_capacity(setup.reps),
        kv_bytes: 0,
        recurrent_bytes: 0,
    };
    for i in 0..=setup.reps {
        if i == 0 && !setup.warmup {
            continue;
        }
        s.clear();
        let mut dr = crate::model::Drafter::new(k, 0.0, vocab, false);
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let first = rng.next(n_vocab);
        let t0 = Instant::now();
        let mut logits = s.step(first, &mut dr)?;
        let n = if i == 0 { 1 } else { n };
        for _ in 1..n {
            let id = sampler.sample(logits);
            logits = s.step(id, &mut dr)?;
        }
        s.settle()?;
        let ns = t0.elapsed().as_nanos() as u64;
        if i > 0 {
            r.samples_ns.push(ns);
            stats.proposed += dr.stats.proposed;
            stats.accepted += dr.stats.accepted;
            stats.steps += dr.stats.steps;
            (r.kv_bytes, r.recurrent_bytes) = s.state_parts();
        }
    }
    Ok((r, stats))
}
