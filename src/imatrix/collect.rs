//! What llama-imatrix's graph callback (`collect_imatrix`) keeps of each weight product: per input
//! column the sum of the squared activations, and the number of rows (tokens) summed.
//!
//! llama.cpp evaluates a group of chunks as one batch of sequences, cut into ubatches, and its
//! callback skips any product whose input has fewer than 16 rows (`src1->ne[1] < 16`). Which rows
//! those are depends on llama.cpp's ubatch split, not on ours, so [`Schedule`] reproduces the split
//! and the collector is told, per chunk position, whether llama.cpp would have kept the row.

use std::collections::{BTreeMap, HashMap};

use anyhow::{bail, Result};

/// llama-imatrix's defaults: logical batch (`-b`) and physical batch (`-ub`) sizes.
pub const N_BATCH: usize = 2048;
pub const N_UBATCH: usize = 512;
/// Products with fewer input rows than this are not collected (llama-imatrix's "small batches").
pub const MIN_ROWS: usize = 16;

/// How llama-imatrix evaluates chunks of `n_ctx` tokens: `n_seq` chunks per batch as separate
/// sequences (`max(1, n_batch / n_ctx)`), and which positions of a chunk reach the callback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub n_ctx: usize,
    /// Chunks evaluated together (as sequences of one batch).
    pub n_seq: usize,
}

/// Per chunk position: whether llama.cpp collects that row for a weight whose input is 2-D
/// (`[n_embd, n_tokens]`: rows of all sequences of the ubatch together) and for one whose input is
/// 3-D (`[n, n_seq_tokens, n_seqs]`: qwen35's `ssm_out`, where the row count checked is per sequence).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mask {
    pub flat: Vec<bool>,
    pub per_seq: Vec<bool>,
}

impl Schedule {
    pub fn new(n_ctx: usize) -> Schedule {
        Schedule {
            n_ctx,
            n_seq: (N_BATCH / n_ctx).max(1),
        }
    }

    /// The mask of a batch of `n_seqs` chunks (fewer than `n_seq` for the last batch).
    ///
    /// A batch holds `n_batch = min(2048, n_seq·n_ctx)` positions of every sequence at a time (a
    /// chunk longer than that takes several batches); llama.cpp's hybrid memory cuts a batch with
    /// `split_equal`: every ubatch takes the same number `k` of the next positions of each sequence,
    /// the most with `k·n_seqs ≤ 512` (at least 1).
    pub fn mask(&self, n_seqs: usize) -> Mask {
        let n = self.n_ctx;
        let n_batch = N_BATCH.min(self.n_seq * n);
        let k_max = (N_UBATCH / n_seqs.max(1)).max(1);
        let (mut flat, mut per_seq) = (vec![false; n], vec![false; n]);
        let mut start = 0;
        while start < n {
            let end = (start + n_batch).min(n);
            let mut p = start;
            while p < end {
                let k = k_max.min(end - p);
                flat[p..p + k].fill(k * n_seqs >= MIN_ROWS);
                per_seq[p..p + k].fill(k >= MIN_ROWS);
                p += k;
            }
            start = end;
        }
        Mask { flat, per_seq }
    }
}

/// Whether llama.cpp's qwen35 graph feeds this weight a 3-D input (`[n, n_seq_tokens, n_seqs]`), so
/// that its "fewer than 16 rows" test counts one sequence's rows: the DeltaNet output projection.
fn per_sequence_input(name: &str) -> bool {
    name.ends_with(".ssm_out.weight")
}

/// One weight's sums.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// `[n_in]`: Σ x² per input column.
    pub sum2: Vec<f32>,
    /// Rows summed.
    pub count: u64,
}

/// Accumulates [`Stats`] per weight from the products it is shown, within chunks.
pub struct Collector {
    process_output: bool,
    stats: BTreeMap<String, Stats>,
    /// Per weight: the chunk position of the next row it will be shown (products come in order).
    next_pos: HashMap<String, usize>,
    mask: Mask,
}

impl Collector {
    /// `process_output`: also collect `output.weight` (llama-imatrix's `--process-output`).
    pub fn new(process_output: bool) -> Collector {
        Collector {
            process_output,
            stats: BTreeMap::new(),
            next_pos: HashMap::new(),
            mask: Mask {
                flat: Vec::new(),
                per_seq: Vec::new(),
            },
        }
    }

    /// Whether llama-imatrix collects the weight named `name`: the decoder blocks' (`blk.*`), and the
    /// LM head with `--process-output` (not the tied embedding matrix, which is `token_embd.weight`).
    pub fn wants(&self, name: &str) -> bool {
        name.starts_with("blk.") || (self.process_output && name == "output.weight")
    }

    /// A chunk starts (from an empty sequence), with llama.cpp's mask of the rows it collects.
    pub fn begin_chunk(&mut self, mask: Mask) {
        self.next_pos.clear();
        self.mask = mask;
    }

    /// One product's input: `x` is `[n_tokens × n_in]`, the rows of the chunk's next positions.
    pub fn observe(&mut self, name: &str, x: &[f32], n_tokens: usize) {
        if n_tokens == 0 || !self.wants(name) {
            return;
        }
        let n_in = x.len() / n_tokens;
        let pos = match self.next_pos.get_mut(name) {
            Some(p) => p,
            None => self.next_pos.entry(name.to_string()).or_insert(0),
        };
        let p0 = *pos;
        *pos += n_tokens;
        let mask = if per_sequence_input(name) {
            &self.mask.per_seq
        } else {
            &self.mask.flat
        };
        let keep = |t: usize| mask.get(p0 + t).copied().unwrap_or(false);
        if !(0..n_tokens).any(keep) {
            return;
        }
        let e = match self.stats.get_mut(name) {
            Some(e) => e,
            None => self.stats.entry(name.to_string()).or_default(),
        };
        if e.sum2.is_empty() {
            e.sum2 = vec![0.0; n_in];
        }
        // A weight has one input width; a mismatch would be a bug in the model code.
        debug_assert_eq!(e.sum2.len(), n_in, "{name}: input width changed");
        for (t, row) in x.chunks_exact(n_in).enumerate() {
            if keep(t) {
                for (a, &v) in e.sum2.iter_mut().zip(row) {
                    *a += v * v;
                }
                e.count += 1;
            }
        }
    }

    /// Fails like llama-imatrix when a sum is no longer finite (an overflow or a NaN activation).
    pub fn check_finite(&self) -> Result<()> {
        for (name, e) in &self.stats {
            if e.sum2.iter().any(|v| !v.is_finite()) {
                bail!("non-finite values detected in {name}");
            }
        }
        Ok(())
    }

    /// The sums by weight name, in name order.
    pub fn into_stats(self) -> BTreeMap<String, Stats> {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_follows_llama_split() {
        // -c 128: 16 chunks per batch; 8 chunks → ubatches of 8 sequences × 64 positions.
        let s = Schedule::new(128);
        assert_eq!(s.n_seq, 16);
        let m = s.mask(8);
        assert!(m.flat.iter().all(|&b| b) && m.per_seq.iter().all(|&b| b));
        // 16 sequences × 32 positions: the 3-D inputs still have 32 ≥ 16 rows.
        assert!(s.mask(16).per_seq.iter().all(|&b| b));
        // -c 32: 64 sequences × 8 positions per ubatch: ssm_out is skipped, the rest collected.
        let m = Schedule::new(32).mask(64);
        assert!(m.flat.iter().all(|&b| b) && m.per_seq.iter().all(|&b| !b));
        // -c 520: one sequence, ubatches of 512 and 8 positions: the last 8 are skipped.
        let m = Schedule::new(520).mask(1);
        assert_eq!(m.flat.iter().filter(|&&b| b).count(), 512);
        assert!(!m.flat[515] && m.flat[511]);
        // -c 4100: batches of 2048 (ubatches of 512), then 4 positions.
        let m = Schedule::new(4100).mask(1);
        assert_eq!(m.flat.iter().filter(|&&b| b).count(), 4096);
    }

    #[test]
    fn sums_squares_of_kept_rows_in_order() {
        let mut c = Collector::new(false);
        c.begin_chunk(Mask {
            flat: vec![true, true, false],
            per_seq: vec![true; 3],
        });
        // Two calls: rows 0..2, then row 2 (masked out).
        c.observe("blk.0.ffn_up.weight", &[1.0, 2.0, 3.0, 4.0], 2);
        c.observe("blk.0.ffn_up.weight", &[5.0, 6.0], 1);
        c.observe("output.weight", &[1.0, 1.0], 1);
        c.observe("token_embd.weight", &[1.0, 1.0], 1);
        c.check_finite().unwrap();
        let s = c.into_stats();
        assert_eq!(s.len(), 1);
        let e = &s["blk.0.ffn_up.weight"];
        assert_eq!((e.sum2.as_slice(), e.count), (&[10.0, 20.0][..], 2));
    }

    #[test]
    fn output_only_with_process_output() {
        let mut c = Collector::new(true);
        c.begin_chunk(Schedule::new(16).mask(1));
        c.observe("output.weight", &[2.0; 32], 16);
        c.observe("blk.1.ssm_out.weight", &[f32::NAN; 16], 16);
        assert!(c.check_finite().is_err());
        let s = c.into_stats();
        assert_eq!(s["output.weight"].count, 16);
        assert_eq!(s["output.weight"].sum2, vec![64.0, 64.0]);
    }
}
