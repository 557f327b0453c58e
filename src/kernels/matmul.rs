//! `out = x · Wᵀ` for a GGUF weight matrix in any supported type, activations in f32.
//!
//! A weight with `ne = {n_in, n_out}` is `n_out` rows of `n_in` elements. Float weights (F32/F16/BF16) are
//! dotted with the f32 activations directly. Quantized weights follow ggml: each activation row is quantized
//! once to the weight type's `vec_dot_type` (Q8_0, Q8_1 or Q8_K), then every weight row is dotted with it
//! block by block. Work is split over output rows; a weight row is read once and used for every token.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::{kernels, GemmOut, Kernels, Line64, Q8kQuants, QuantGemm, QuantsGemm, FEW_TOKENS};
use crate::quant::{BlockQ8K, GgmlType};

/// A 2-D weight matrix viewed in place (borrowed from the GGUF mapping).
#[derive(Clone, Copy, Debug)]
pub struct Weight<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    /// Elements per row (`ne[0]`).
    pub n_in: usize,
    /// Rows (`ne[1]`).
    pub n_out: usize,
    pub data: &'a [u8],
}

impl<'a> Weight<'a> {
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.n_out
    }

    pub fn row(&self, r: usize) -> &'a [u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }
}

/// Whether weights of type `ty` with rows of `n_in` elements can be multiplied; the error reads after
/// a tensor name ("has type ...").
pub fn can_multiply(ty: GgmlType, n_in: usize) -> Result<(), String> {
    let float = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    let quant = GgmlType::WEIGHT_QUANTS.contains(&ty);
    if !float && !quant {
        return Err(format!("has type {ty}, which deltaq cannot multiply"));
    }
    let act = ty.vec_dot_type();
    if ty.row_bytes(n_in as u64).is_none() || act.row_bytes(n_in as u64).is_none() {
        return Err(format!(
            "has row length {n_in}, not a multiple of the {ty}/{act} block size"
        ));
    }
    Ok(())
}

/// `out[t][r] = Σ_c W[r][c] · x[t][c]` for `n_tokens` rows of `x` (`[n_tokens × n_in]`, row-major);
/// `out` is `[n_tokens × n_out]`.
pub fn matmul(w: &Weight, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    matmuls(x, n_tokens, &mut [(w, out)]);
}

/// [`matmul`] with the kernel table `k` instead of the chosen one (tests hold every table to the
/// properties `matmul` promises).
pub fn matmul_with(k: &'static Kernels, w: &Weight, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    matmuls_with(k, x, n_tokens, &mut [(w, out)]);
}

/// Most weights one [`matmuls`] call takes (DeltaNet's input projections are four).
pub const MAX_JOBS: usize = 4;

thread_local! {
    /// The calling thread's quantized activations, kept from one [`matmuls`] call to the next so that
    /// decoding allocates nothing (grown to the largest call; a nested call finds it taken and uses its
    /// own).
    static ACT_BUF: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    /// The calling thread's `[rows × tokens]` tile of a few-token work item ([`Plan::block`]): kept, so
    /// that a verification's items do not zero 16 KiB each.
    static TILE_BUF: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The calling thread's Q8_K quants in aligned rows, for a table's [`QuantGemm::run_quants`].
    static QUANTS_BUF: Cell<(Vec<Line64>, Vec<[i16; 8]>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

/// Frees the calling thread's quantized-activation buffer (grown to the largest call, e.g. a
/// prompt's ubatch); the next call grows it again.
pub fn release_act_buffer() {
    drop(ACT_BUF.take());
    drop(QUANTS_BUF.take());
}

/// [`matmul`] for several weights (at most [`MAX_JOBS`]) that read the same input `x`: the activations
/// are quantized once per activation type and every product runs in one parallel region (one
/// fork/join instead of one each).
pub fn matmuls(x: &[f32], n_tokens: usize, jobs: &mut [(&Weight, &mut [f32])]) {
    OBSERVER.with_borrow_mut(|o| {
        if let Some(f) = o {
            for (w, _) in jobs.iter() {
                f(w, x, n_tokens);
            }
        }
    });
    matmuls_with(kernels(), x, n_tokens, jobs)
}

/// Sees `(weight, x, n_tokens)` of every product [`matmul`]/[`matmuls`] computes on the thread that
/// installed it ([`observe_matmuls`]): the input rows `x` (`[n_tokens × w.n_in]`) of that weight, as
/// llama.cpp's graph callback sees `src1` (what `deltaq imatrix` collects). It must not multiply.
pub type MatmulObserver = Box<dyn FnMut(&Weight, &[f32], usize)>;

thread_local! {
    /// Off (`None`) but while `deltaq imatrix` runs: one thread-local read per product, nothing
    /// passed through the model's code.
    static OBSERVER: RefCell<Option<MatmulObserver>> = const { RefCell::new(None) };
}

/// Installs `obs` on the calling thread until the returned guard drops (then the previous observer,
/// if any, is back). Products computed on other threads are not seen: run the model on this one.
pub fn observe_matmuls(obs: MatmulObserver) -> ObserverGuard {
    let previous = OBSERVER.with_borrow_mut(|o| o.replace(obs));
    ObserverGuard {
        previous,
        _same_thread: std::marker::PhantomData,
    }
}

/// Uninstalls the observer of [`observe_matmuls`] when dropped (on the thread that installed it:
/// the guard is not `Send`).
pub struct ObserverGuard {
    previous: Option<MatmulObserver>,
    _same_thread: std::marker::PhantomData<*const ()>,
}

impl Drop for ObserverGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        OBSERVER.with_borrow_mut(|o| *o = previous);
    }
}

fn matmuls_with(
    k: &'static Kernels,
    x: &[f32],
    n_tokens: usize,
    jobs: &mut [(&Weight, &mut [f32])],
) {
    let n_in = x.len() / n_tokens.max(1);
    assert!(
        jobs.len() <= MAX_JOBS,
        "at most {MAX_JOBS} weights per call"
    );
    for (w, out) in jobs.iter() {
        assert_eq!(w.n_in, n_in, "{}: activation length", w.name);
        assert_eq!(x.len(), n_tokens * w.n_in, "{}: activation length", w.name);
        assert_eq!(out.len(), n_tokens * w.n_out, "{}: output length", w.name);
    }
    if n_tokens == 0 {
        return;
    }
    let act_bytes = |w: &Weight| {
        w.ty.vec_dot_type()
            .row_bytes(n_in as u64)
            .expect("row length checked at load") as usize
    };
    // Every activation row is quantized once per activation type, and every weight of that type reuses
    // it: job `j`'s quantized rows start at `at[j]` in `buf` (`None` for float weights); `fresh[j]`
    // marks the first job of each type, which quantizes them.
    let mut at = [None; MAX_JOBS];
    let mut fresh = [false; MAX_JOBS];
    let mut len = 0;
    for (j, (w, _)) in jobs.iter().enumerate() {
        if is_float(w.ty) {
            continue;
        }
        let act = w.ty.vec_dot_type();
        at[j] = match (0..j).find(|&i| at[i].is_some() && jobs[i].0.ty.vec_dot_type() == act) {
            Some(i) => at[i],
            None => {
                fresh[j] = true;
                let start = len;
                len += n_tokens * act_bytes(w);
                Some(start)
            }
        };
    }
    let mut buf = ACT_BUF.take();
    if buf.len() < len {
        buf.resize(len, 0);
    }
    for (j, (w, _)) in jobs.iter().enumerate() {
        let (Some(start), true) = (at[j], fresh[j]) else {
            continue;
        };
        let (act, ab) = (w.ty.vec_dot_type(), act_bytes(w));
        let q = &mut buf[start..start + n_tokens * ab];
        if n_tokens == 1 {
            (k.quantize_act)(act, x, q);
        } else {
            q.par_chunks_mut(ab)
                .zip(x.par_chunks(n_in))
                .for_each(|(q, x)| (k.quantize_act)(act, x, q));
        }
    }

    // A GEMM that wants the Q8_K quants as aligned rows gets them copied once for all its items.
    let gemm_of = |w: &Weight| {
        k.quant_gemm
            .filter(|g| n_tokens >= GEMM_MIN_TOKENS && (g.supports)(w.ty))
    };
    let wants_quants = |w: &Weight| {
        w.ty.vec_dot_type() == GgmlType::Q8_K
            && gemm_of(w)
                .and_then(|g| g.run_quants)
                .is_some_and(|q| (q.supports)(w.ty))
    };
    let mut quants_buf = QUANTS_BUF.take();
    let quants_at = jobs
        .iter()
        .enumerate()
        .find_map(|(j, (w, _))| at[j].filter(|_| wants_quants(w)));
    if let Some(start) = quants_at {
        let ab = GgmlType::Q8_K
            .row_bytes(n_in as u64)
            .expect("row length checked at load") as usize;
        q8k_quants(&buf[start..start + n_tokens * ab], n_in, &mut quants_buf);
    }
    let quants = quants_at.map(|_| Q8kQuants {
        lines: &quants_buf.0[..n_tokens * n_in / 64],
        sums32: &quants_buf.1[..n_tokens * n_in / 256],
        n_in,
    });

    {
        // Work items: blocks of weight rows × blocks of tokens, numbered job by job, row block by row
        // block, so consecutive items (one thread's share) reuse the same weight rows while they are in
        // cache.
        // With the table's prefill GEMM an item is a panel of rows × all tokens (the panels are unpacked
        // once per item; NEON's once per 32 tokens).
        let n_jobs = jobs.len();
        let mut jobs = jobs.iter_mut().enumerate();
        let plans: [Option<Plan>; MAX_JOBS] = std::array::from_fn(|_| {
            jobs.next().map(|(j, (w, out))| {
                let gemm = gemm_of(w);
                let (rows, tok_block) = match gemm {
                    Some(_) => (GEMM_ROWS, n_tokens),
                    None => (rows_per_item(w, n_tokens), n_tokens.min(TOKEN_BLOCK)),
                };
                let n_tok_blocks = n_tokens.div_ceil(tok_block);
                Plan {
                    k,
                    w,
                    act: at[j].map(|start| &buf[start..start + n_tokens * act_bytes(w)]),
                    quants: quants.filter(|_| wants_quants(w)),
                    gemm,
                    out: OutPtr(out.as_mut_ptr()),
                    rows,
                    tok_block,
                    n_tok_blocks,
                    n_items: w.n_out.div_ceil(rows) * n_tok_blocks,
                }
            })
        });
        let mut first_item = [0; MAX_JOBS];
        let mut n_items = 0;
        for (first, p) in first_item.iter_mut().zip(plans.iter().flatten()) {
            *first = n_items;
            n_items += p.n_items;
        }
        let first_item = &first_item[..n_jobs];
        let run = |item: usize| {
            let j = first_item.partition_point(|&f| f <= item) - 1;
            let p = plans[j].as_ref().expect("a plan per job");
            let local = item - first_item[j];
            let (r0, t0) = (
                local / p.n_tok_blocks * p.rows,
                local % p.n_tok_blocks * p.tok_block,
            );
            let rr = p.rows.min(p.w.n_out - r0);
            let tt = p.tok_block.min(n_tokens - t0);
            p.block(x, r0, rr, t0, tt, n_tokens);
        };
        let threads = rayon::current_num_threads();
        if n_items == 1 {
            run(0);
        } else if (2..=FEW_TOKENS).contains(&n_tokens) && threads > 1 {
            // Few tokens: the items in shrinking sizes, handed out in order (see `guided_items`).
            let mut items = ITEMS.take();
            let shapes = plans.iter().flatten().map(|p| (p.w.row_bytes(), p.w.n_out));
            guided_items(shapes, threads, &mut items);
            let next = AtomicUsize::new(0);
            let work = |_| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(j, r0, rr)) = items.get(i) else {
                    break;
                };
                let p = plans[j].as_ref().expect("a plan per job");
                p.block(x, r0, rr, 0, n_tokens, n_tokens);
            };
            (0..threads).into_par_iter().for_each(work);
            ITEMS.set(items);
        } else {
            (0..n_items).into_par_iter().for_each(run);
        }
    }
    ACT_BUF.set(buf);
    QUANTS_BUF.set(quants_buf);
}

/// Q8_K block layout ([`BlockQ8K`]): an f32 scale, 256 quants, 16 i16 sums of 16 quants.
const Q8K_BLOCK: usize = size_of::<BlockQ8K>();
const Q8K_QS: usize = core::mem::offset_of!(BlockQ8K, qs);
const Q8K_SUMS: usize = core::mem::offset_of!(BlockQ8K, bsums);

/// The quants of `n_tok` Q8_K rows of `n_in` values (`q`, back to back) as [`Q8kQuants`] rows and sums
/// per 32 in `out` (grown as needed), one token per thread task.
pub fn q8k_quants(q: &[u8], n_in: usize, out: &mut (Vec<Line64>, Vec<[i16; 8]>)) {
    let nb = n_in / 256;
    let n_tok = q.len() / (nb * Q8K_BLOCK);
    assert!(n_in.is_multiple_of(256) && q.len() == n_tok * nb * Q8K_BLOCK);
    if out.0.len() < n_tok * n_in / 64 {
        out.0.resize(n_tok * n_in / 64, Line64([0; 64]));
    }
    if out.1.len() < n_tok * nb {
        out.1.resize(n_tok * nb, [0; 8]);
    }
    let bytes = bytemuck::cast_slice_mut::<Line64, u8>(&mut out.0[..n_tok * n_in / 64]);
    bytes
        .par_chunks_mut(n_in)
        .zip(out.1.par_chunks_mut(nb))
        .zip(q.par_chunks(nb * Q8K_BLOCK))
        .for_each(|((dst, sums), row)| {
            for ((d, s), blk) in dst
                .chunks_exact_mut(256)
                .zip(sums)
                .zip(row.chunks_exact(Q8K_BLOCK))
            {
                d.copy_from_slice(&blk[Q8K_QS..Q8K_QS + 256]);
                let sum16 = |i: usize| {
                    i16::from_le_bytes([blk[Q8K_SUMS + 2 * i], blk[Q8K_SUMS + 2 * i + 1]])
                };
                // Each is at most 32 · 127 in size: no overflow.
                *s = core::array::from_fn(|i| sum16(2 * i) + sum16(2 * i + 1));
            }
        });
}

thread_local! {
    /// The calling thread's list of few-token work items (`guided_items`), kept between calls.
    static ITEMS: Cell<Vec<(usize, usize, usize)>> = const { Cell::new(Vec::new()) };
}

/// Smallest few-token work item, in weight bytes: the one-token item size.
const FEW_TOKEN_MIN_ITEM_BYTES: usize = DECODE_ITEM_BYTES;

/// The work items `(job, first row, rows)` of a few-token call over weights of `(row bytes, rows)`, job by
/// job, in shrinking sizes: each takes a `2·threads`-th of the bytes still to come, between
/// [`FEW_TOKEN_MIN_ITEM_BYTES`] and [`FEW_TOKEN_ITEM_BYTES`] (guided self-scheduling), in multiples of 4
/// rows (the kernels' row tile). Handed out in this order, the large items keep the row streams long and
/// the small last ones let the threads finish together: with equal 2 MiB items the thread that drew the
/// last one ran up to a whole item (about 170 µs from memory) alone, at every product.
fn guided_items(
    shapes: impl Iterator<Item = (usize, usize)> + Clone,
    threads: usize,
    items: &mut Vec<(usize, usize, usize)>,
) {
    items.clear();
    let mut left: usize = shapes.clone().map(|(rb, n_out)| rb * n_out).sum();
    for (j, (rb, n_out)) in shapes.enumerate() {
        let mut r0 = 0;
        while r0 < n_out {
            let bytes =
                (left / (2 * threads)).clamp(FEW_TOKEN_MIN_ITEM_BYTES, FEW_TOKEN_ITEM_BYTES);
            let rr = (bytes / rb).next_multiple_of(4).max(4).min(n_out - r0);
            items.push((j, r0, rr));
            left = left.saturating_sub(rr * rb);
            r0 += rr;
        }
    }
}

/// Weight rows per work item in prefill (a multiple of every kernel's row tile).
const ROW_BLOCK: usize = 64;

/// Tokens per work item in prefill: the block's quantized activations (≤ 64 rows) stay in L2 while the
/// item's weight rows stream past them.
const TOKEN_BLOCK: usize = 64;

/// Weight rows per work item with a prefill GEMM (four 16-row panels on AVX-512, sixteen 4-row panels
/// on NEON).
const GEMM_ROWS: usize = 64;

/// Fewest tokens for which the prefill GEMM is used: below, unpacking a panel costs more than it saves.
const GEMM_MIN_TOKENS: usize = 16;

/// Weight bytes per work item in decode, at most. The decode kernels read a tile's four rows as four
/// streams, each through its own quarter of the item (see the x86 `quant_rows`), and a stream runs at
/// full speed only once the prefetchers have ramped up on it. For a 4096×4096 Q4_K from memory
/// (`examples/kq_speed ratio`, `ITEM=rows`), items of 27, 72, 144 and 288 KiB measured 9.8, 12.0,
/// 13.3 and 14.3 GB/s; larger ones no faster.
const DECODE_ITEM_BYTES: usize = 256 << 10;

/// Weight bytes per work item for 2 to [`FEW_TOKENS`] tokens, at most. Their tiles read more streams at
/// once (16 rows on AVX-512 for Q4_K) and each stream moves more slowly, so the ramp-up at an item's start
/// costs them more: from memory on the 2-core Intel Xeon VM (`examples/few_tokens`, 2 threads, medians of
/// per-round ratios), 3 tokens took 1.22–1.27× one token's time with 256 KiB items and 1.12–1.16× with
/// 2 MiB (Q4_K 12288×4096), 1.18× and 1.08–1.11× (Q6_K 4096×12288); 4 and 16 MiB were no better.
/// On several threads the last items of a call are smaller ([`guided_items`]).
const FEW_TOKEN_ITEM_BYTES: usize = 2 << 20;

/// Weight rows per work item: in decode and for few tokens (≤ [`FEW_TOKENS`], which the kernels run in
/// the decode layout: each weight row read once for all tokens), the weight cut into pieces of at most
/// [`DECODE_ITEM_BYTES`] (one token) or [`FEW_TOKEN_ITEM_BYTES`] (2 or more), their count a multiple of
/// the threads so that each thread streams the same amount (memory-bound; 2 or more tokens on several
/// threads take [`guided_items`] instead); [`ROW_BLOCK`] ×
/// [`TOKEN_BLOCK`] in prefill. Multiples of 4 (the kernels' row tiles).
fn rows_per_item(w: &Weight, n_tokens: usize) -> usize {
    if n_tokens <= FEW_TOKENS {
        decode_rows_per_item(
            w.data.len(),
            w.n_out,
            rayon::current_num_threads(),
            n_tokens,
        )
    } else {
        ROW_BLOCK
    }
}

/// Rows per decode work item for a weight of `bytes` in `n_out` rows on `threads` threads with `n_tokens`
/// (≤ [`FEW_TOKENS`]) tokens (see [`DECODE_ITEM_BYTES`], [`FEW_TOKEN_ITEM_BYTES`]); public so that the
/// kernel benchmarks split a matrix as decoding does.
pub fn decode_rows_per_item(bytes: usize, n_out: usize, threads: usize, n_tokens: usize) -> usize {
    let threads = threads.max(1);
    let item_bytes = if n_tokens > 1 {
        FEW_TOKEN_ITEM_BYTES
    } else {
        DECODE_ITEM_BYTES
    };
    let items = bytes.div_ceil(item_bytes).div_ceil(threads) * threads;
    n_out.div_ceil(items).next_multiple_of(4)
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// One weight's share of a [`matmuls`] call.
struct Plan<'a> {
    k: &'static Kernels,
    w: &'a Weight<'a>,
    /// The quantized activations (quantized weights only).
    act: Option<&'a [u8]>,
    /// Their quants as aligned rows, for a GEMM that takes them ([`QuantGemm::run_quants`]).
    quants: Option<Q8kQuants<'a>>,
    /// The table's prefill GEMM, if it takes this weight type and the call has enough tokens.
    gemm: Option<QuantGemm>,
    out: OutPtr,
    /// Rows and tokens per work item; tokens blocks per row block.
    rows: usize,
    tok_block: usize,
    n_tok_blocks: usize,
    n_items: usize,
}

/// The output matrix, written by disjoint blocks from several threads.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every work item writes a disjoint set of elements (its rows × its tokens), see `Plan::block`.
unsafe impl Send for OutPtr {}
// SAFETY: as above; nothing reads through the pointer.
unsafe impl Sync for OutPtr {}

impl Plan<'_> {
    /// Computes rows `r0..r0+rr` × tokens `t0..t0+tt` and stores them into the token-major output.
    fn block(&self, x: &[f32], r0: usize, rr: usize, t0: usize, tt: usize, n_tokens: usize) {
        let (w, k) = (self.w, self.k);
        let (n_in, n_out) = (w.n_in, w.n_out);
        let wb = &w.data[r0 * w.row_bytes()..(r0 + rr) * w.row_bytes()];
        if let (Some(g), Some(act)) = (self.gemm, self.act) {
            let ab = act.len() / n_tokens;
            // SAFETY: `out` is `[n_tokens × n_out]` (checked in `matmuls`, which holds the `&mut` for the
            // whole call); this item alone writes tokens `t0..t0+tt`' elements `r0..r0+rr`, and
            // `rr ≤ n_out`.
            let o = unsafe { GemmOut::from_raw(self.out.0.add(t0 * n_out + r0), rr, tt, n_out) };
            let a = &act[t0 * ab..(t0 + tt) * ab];
            match (g.run_quants, self.quants) {
                (Some(QuantsGemm { run, .. }), Some(q)) => {
                    let lines = &q.lines[t0 * n_in / 64..(t0 + tt) * n_in / 64];
                    let sums32 = &q.sums32[t0 * n_in / 256..(t0 + tt) * n_in / 256];
                    run(
                        w.ty,
                        wb,
                        a,
                        Q8kQuants {
                            lines,
                            sums32,
                            n_in,
                        },
                        o,
                    )
                }
                _ => (g.run)(w.ty, wb, a, o),
            }
            return;
        }
        // Rows `r0 + p0 ..` (`pr` of them) of the item → `o` (`[pr × tt]`).
        let compute = |p0: usize, pr: usize, o: &mut [f32]| {
            let wb = &wb[p0 * w.row_bytes()..(p0 + pr) * w.row_bytes()];
            match self.act {
                Some(act) => {
                    let ab = act.len() / n_tokens;
                    (k.quant_rows)(w.ty, wb, &act[t0 * ab..(t0 + tt) * ab], tt, o)
                }
                None => (k.float_rows)(w.ty, wb, &x[t0 * n_in..(t0 + tt) * n_in], tt, o),
            }
        };
        if tt == 1 {
            // SAFETY: `out` is `[n_tokens × n_out]` (checked in `matmuls`, which holds the `&mut` for the
            // whole call); this item alone writes row `t0`'s elements `r0..r0+rr`.
            let o = unsafe { std::slice::from_raw_parts_mut(self.out.0.add(t0 * n_out + r0), rr) };
            compute(0, rr, o);
            return;
        }
        // The kernels write `[rows × tokens]`; the output is `[tokens × rows]`. A few-token item (decode
        // sized, possibly more than ROW_BLOCK rows) goes through the buffer in pieces.
        let mut buf = TILE_BUF.take();
        buf.resize(ROW_BLOCK * TOKEN_BLOCK, 0.0);
        let piece = (buf.len() / tt) / 4 * 4;
        for p0 in (0..rr).step_by(piece) {
            let pr = piece.min(rr - p0);
            let tile = &mut buf[..pr * tt];
            compute(p0, pr, tile);
            for t in 0..tt {
                // SAFETY: as above; this item alone writes token `t0 + t`'s elements `r0..r0+rr`.
                let o = unsafe {
                    std::slice::from_raw_parts_mut(self.out.0.add((t0 + t) * n_out + r0 + p0), pr)
                };
                for (o, v) in o.iter_mut().zip(tile[t..].iter().step_by(tt)) {
                    *o = *v;
                }
            }
        }
        TILE_BUF.set(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant;

    #[test]
    fn guided_items_cover_every_row_once_in_shrinking_items() {
        // The 9B's DeltaNet input projections (Q4_K rows of 4096 columns) and a small weight.
        let shapes = [
            (2304, 8192),
            (2304, 4096),
            (2304, 32),
            (2304, 32),
            (144, 10),
        ];
        for threads in [2, 3, 8] {
            let mut items = Vec::new();
            guided_items(shapes.iter().copied(), threads, &mut items);
            let mut next = [0usize; 5];
            let mut last_bytes = usize::MAX;
            for (i, &(j, r0, rr)) in items.iter().enumerate() {
                let (rb, n_out) = shapes[j];
                assert_eq!(r0, next[j], "job {j}: rows in order, none skipped");
                assert!(j == 0 || next[..j].iter().zip(&shapes).all(|(n, s)| *n == s.1));
                next[j] += rr;
                let job_end = r0 + rr == n_out;
                assert!(rr % 4 == 0 || job_end, "item {i}: {rr} rows");
                assert!(
                    rr * rb <= FEW_TOKEN_ITEM_BYTES + 4 * rb,
                    "item {i} too large"
                );
                if !job_end {
                    assert!(rr * rb >= FEW_TOKEN_MIN_ITEM_BYTES, "item {i} too small");
                    assert!(
                        rr * rb <= last_bytes.saturating_add(4 * rb),
                        "item {i} larger than the one before"
                    );
                    last_bytes = rr * rb;
                }
            }
            assert_eq!(
                next.to_vec(),
                shapes.map(|s| s.1).to_vec(),
                "every row once"
            );
            // Large items first (as large as allowed on two threads), the smallest size at the end.
            let total: usize = shapes.iter().map(|(rb, n)| rb * n).sum();
            let first = (total / (2 * threads)).min(FEW_TOKEN_ITEM_BYTES);
            assert!(
                items[0].2 * 2304 + 4 * 2304 >= first,
                "{threads} threads: {items:?}"
            );
            assert!(threads > 2 || first == FEW_TOKEN_ITEM_BYTES);
            let (j, _, rr) = items[items.len() - 5];
            assert_eq!(
                (j, rr),
                (1, FEW_TOKEN_MIN_ITEM_BYTES.div_ceil(4 * 2304) * 4)
            );
        }
    }

    fn f32_weight(rows: &[Vec<f32>]) -> Vec<u8> {
        rows.iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    #[test]
    fn float_matmul_matches_naive() {
        let (n_in, n_out, n_tok) = (19, 70, 3);
        let w: Vec<Vec<f32>> = (0..n_out)
            .map(|r| {
                (0..n_in)
                    .map(|c| ((r * 7 + c * 3) % 11) as f32 - 5.0)
                    .collect()
            })
            .collect();
        let x: Vec<f32> = (0..n_tok * n_in)
            .map(|i| (i % 5) as f32 * 0.5 - 1.0)
            .collect();
        let bytes = f32_weight(&w);
        let wt = Weight {
            name: "w",
            ty: GgmlType::F32,
            n_in,
            n_out,
            data: &bytes,
        };
        for n in [1, n_tok] {
            let mut out = vec![0f32; n * n_out];
            matmul(&wt, &x[..n * n_in], n, &mut out);
            for t in 0..n {
                for r in 0..n_out {
                    let want: f32 = (0..n_in).map(|c| w[r][c] * x[t * n_in + c]).sum();
                    assert_eq!(out[t * n_out + r], want, "t={t} r={r}");
                }
            }
        }
        // F16 storage of the same (exactly representable) values gives the same result.
        let h: Vec<u8> = w
            .iter()
            .flatten()
            .flat_map(|v| quant::f16_from_f32(*v).to_le_bytes())
            .collect();
        let wh = Weight {
            name: "w",
            ty: GgmlType::F16,
            n_in,
            n_out,
            data: &h,
        };
        let (mut a, mut b) = (vec![0f32; n_tok * n_out], vec![0f32; n_tok * n_out]);
        matmul(&wt, &x, n_tok, &mut a);
        matmul(&wh, &x, n_tok, &mut b);
        assert_eq!(a, b);
    }

    /// Quantized weights: the result is the f32 product of the dequantized weights up to the activation
    /// quantization error (8-bit blocks: ≲ 1% of Σ|w·x|), for legacy and K-quant types.
    #[test]
    fn quantized_matmul_close_to_dequantized() {
        let (n_in, n_out, n_tok) = (512, 9, 2);
        let mut seed = 12345u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let wf: Vec<f32> = (0..n_in * n_out).map(|_| rnd()).collect();
        let x: Vec<f32> = (0..n_tok * n_in).map(|_| rnd()).collect();
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let row = ty.row_bytes(n_in as u64).unwrap() as usize;
            let mut data = vec![0u8; row * n_out];
            for (r, d) in data.chunks_exact_mut(row).enumerate() {
                quant::quantize_row(ty, &wf[r * n_in..(r + 1) * n_in], d).unwrap();
            }
            let w = Weight {
                name: "w",
                ty,
                n_in,
                n_out,
                data: &data,
            };
            let mut out = vec![0f32; n_tok * n_out];
            matmul(&w, &x, n_tok, &mut out);
            let mut deq = vec![0f32; n_in];
            for r in 0..n_out {
                quant::dequantize_row(ty, w.row(r), &mut deq).unwrap();
                for t in 0..n_tok {
                    let xt = &x[t * n_in..(t + 1) * n_in];
                    let exact: f32 = deq.iter().zip(xt).map(|(a, b)| a * b).sum();
                    let mag: f32 = deq.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                    let got = out[t * n_out + r];
                    assert!(
                        (got - exact).abs() <= 0.01 * mag,
                        "{ty} r={r} t={t}: {got} vs {exact}"
                    );
                }
            }
        }
    }
}
