//! Gated full attention (spec §3.2): joint Q/gate projection, per-head Q/K RMSNorm, partial NEOX RoPE,
//! causal GQA over the KV cache (F16 by default, as llama.cpp; F32, Q8_0 or Q4_0 on request), sigmoid
//! output gate.

use half::f16;
use rayon::prelude::*;

use super::hparams::HParams;
use super::weights::AttentionWeights;
use super::{carve, for_rows};
use crate::kernels::attend::{
    attend_many_into, merge_chunks, AttnOut, ChunkStat, KvElem, KvPages, KvStore, CHUNK,
};
use crate::kernels::attend_quant::{attend_quant_many_into, KvBlock};
use crate::kernels::ops::{hadamard, rms_norm, rope, rope_cos_sin, sigmoid_mul};
use crate::kernels::{matmul, matmuls};
use crate::quant::{BlockQ4_0, BlockQ8_0};

/// Element type of the KV cache. F16 halves its memory (12 KiB instead of 24 KiB per token for
/// 0.8B/2B); attention still computes in f32 (rows are widened exactly as they are read), so the only
/// difference is the rounding of K and V when they are stored. Q8_0 and Q4_0 store blocks of 32 values
/// (34 and 18 bytes): keys are dotted with the query quantized to Q8_0, values dequantized as they are
/// read (as llama.cpp's `-ctk`/`-ctv q8_0`, `q4_0`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    #[default]
    F16,
    F32,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub const ALL: [KvType; 4] = [KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0];

    /// `f16` / `f32` / `q8_0` / `q4_0` (llama.cpp's `--cache-type-k` names).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    pub fn from_name(s: &str) -> Option<KvType> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }

    /// Values per stored unit: 1, or the block size; a row must hold a whole number of them.
    pub fn block(self) -> usize {
        match self {
            KvType::F16 | KvType::F32 => 1,
            KvType::Q8_0 | KvType::Q4_0 => 32,
        }
    }

    /// Bytes of a row of `n` values (`n` a multiple of [`KvType::block`]).
    pub fn row_bytes(self, n: usize) -> usize {
        match self {
            KvType::F16 => 2 * n,
            KvType::F32 => 4 * n,
            KvType::Q8_0 => n / 32 * 34,
            KvType::Q4_0 => n / 32 * 18,
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Positions per page of the KV cache. Pages are allocated as the sequence grows and never move, so
/// growing the cache copies nothing (no reallocation of the whole cache, no transient double size),
/// and the last page is cut to the context size, so the cache never holds room for more than `n_ctx`
/// positions. A multiple of the attention kernel's score block (128), so paging leaves the order of
/// its sums unchanged.
pub const KV_PAGE: usize = 256;

/// Keys (after norm + RoPE) and raw values of every past position, per KV head `[pos][hd]` (stored as
/// `T`: elements, or blocks of `T::PER` values), in pages of [`KV_PAGE`] positions. Each head has pages of
/// its own, so its rows lie back to back: the attention kernels walk one head's rows, and rows of
/// several heads interleaved (`[pos][Hkv·hd]`) left half or more of every 4 KiB page of each walk unused,
/// which the prefetchers and the L1 sets paid for (`attend_probe`, one head's shape of the 0.8B, f16,
/// 16 tokens after 16384: 83 GFLOP/s with 2 heads interleaved, 78 with 4, 89–94 with one).
#[derive(Clone, Debug)]
pub struct KvPaged<T> {
    /// `k[h][page]`: head `h`'s keys, `[pos][hd / T::PER]` units per page.
    k: Vec<Vec<Vec<T>>>,
    v: Vec<Vec<Vec<T>>>,
    /// Positions stored.
    len: usize,
    /// Positions the cache may grow to.
    n_ctx: usize,
    /// Units of `T` per position of one head (`hd / T::PER`).
    row: usize,
}

impl<T: KvStore> KvPaged<T> {
    fn new(n_ctx: usize, heads: usize, row: usize) -> KvPaged<T> {
        KvPaged {
            k: vec![Vec::new(); heads],
            v: vec![Vec::new(); heads],
            len: 0,
            n_ctx,
            row,
        }
    }

    /// Positions the page starting at position `p0` holds when full.
    fn page_rows(&self, p0: usize) -> usize {
        KV_PAGE.min(self.n_ctx - p0)
    }

    /// Appends the rows of `k` and `v` (`[T × Hkv·hd]` f32 each), rounded to `T`.
    fn push(&mut self, k: &[f32], v: &[f32]) {
        let (row, heads) = (self.row, self.k.len());
        let (hv, values) = (row * T::PER, heads * row * T::PER);
        let n = k.len() / values;
        assert!(k.len() == n * values && v.len() == k.len(), "KV rows");
        assert!(
            self.len + n <= self.n_ctx,
            "KV cache full: {} + {n} positions > {}",
            self.len,
            self.n_ctx
        );
        let mut done = 0;
        while done < n {
            let at = self.len % KV_PAGE;
            let p0 = self.len - at;
            let page_rows = self.page_rows(p0);
            let ip = p0 / KV_PAGE;
            let take = (page_rows - at).min(n - done);
            for (pages, src) in [(&mut self.k, k), (&mut self.v, v)] {
                for (h, pages) in pages.iter_mut().enumerate() {
                    if at == 0 && ip == pages.len() {
                        pages.push(Vec::with_capacity(page_rows * row));
                    }
                    let page = &mut pages[ip];
                    // A snapshot (clone) holds its last page trimmed to the rows in use: give it back
                    // its full size once, not by doubling.
                    page.reserve_exact(page_rows * row - page.len());
                    for t in done..done + take {
                        T::extend_from_f32(page, &src[t * values + h * hv..][..hv]);
                    }
                }
            }
            self.len += take;
            done += take;
        }
    }

    /// Every page of every head, keys and values.
    fn pages_mut(&mut self) -> impl Iterator<Item = &mut Vec<Vec<T>>> {
        self.k.iter_mut().chain(&mut self.v)
    }

    /// Keeps the first `len` positions (a speculative rollback); pages past them stay allocated,
    /// emptied, for the positions to come.
    fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let (keep, row) = (len.div_ceil(KV_PAGE), self.row);
        for pages in self.pages_mut() {
            for (ip, page) in pages.iter_mut().enumerate() {
                if ip >= keep {
                    page.clear();
                } else if ip + 1 == keep {
                    page.truncate((len - ip * KV_PAGE) * row);
                }
            }
        }
        self.len = len;
    }

    /// Forgets every position and keeps the pages (emptied) for the positions to come: a cleared
    /// cache refills without allocating, as llama.cpp's preallocated one does.
    fn clear(&mut self) {
        for page in self.pages_mut().flatten() {
            page.clear();
        }
        self.len = 0;
    }

    /// Bytes allocated for K and V.
    fn bytes(&self) -> usize {
        let pages = self.k.iter().chain(&self.v).flatten();
        pages.map(Vec::capacity).sum::<usize>() * std::mem::size_of::<T>()
    }

    /// The view of KV head `m` for the attention kernel.
    fn head(&self, m: usize) -> KvPages<'_, T> {
        KvPages {
            k: &self.k[m],
            v: &self.v[m],
            page_rows: KV_PAGE,
            stride: self.row,
            offset: 0,
        }
    }
}

/// The Walsh–Hadamard rotations a quantized cache is stored in, as llama.cpp does by default
/// (`attn_rot_k` / `attn_rot_v` in its KV cache): queries and keys after RoPE by blocks of `k` values
/// (the largest power of two dividing the head dim), values by blocks of `v = 64` and the attention
/// output rotated back the same way. The rotation spreads outlier channels over a block before it is
/// quantized. `DELTAQ_ATTN_ROT_DISABLE=1` turns it off (llama.cpp: `LLAMA_ATTN_ROT_DISABLE=1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KvRotation {
    pub k: usize,
    pub v: usize,
}

impl KvRotation {
    /// The rotation of a `ty` cache with heads of `hd` values, if any: quantized types and head dims
    /// that are multiples of 64.
    pub fn of(ty: KvType, hd: usize) -> Option<KvRotation> {
        static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let disabled = *DISABLED.get_or_init(|| {
            std::env::var("DELTAQ_ATTN_ROT_DISABLE")
                .is_ok_and(|v| v.trim().parse::<i64>().unwrap_or(0) != 0)
        });
        let quantized = matches!(ty, KvType::Q8_0 | KvType::Q4_0);
        if disabled || !quantized || hd == 0 || !hd.is_multiple_of(64) {
            return None;
        }
        Some(KvRotation {
            k: 1 << hd.trailing_zeros(),
            v: 64,
        })
    }
}

/// One attention layer's KV cache, in the session's [`KvType`].
#[derive(Clone, Debug)]
pub enum KvCache {
    F16(KvPaged<f16>),
    F32(KvPaged<f32>),
    Q8_0(KvPaged<BlockQ8_0>),
    Q4_0(KvPaged<BlockQ4_0>),
}

/// `$body` with `$c` bound to the cache of whichever type `$cache` holds.
macro_rules! each_kv {
    ($cache:expr, $c:ident => $body:expr) => {
        match $cache {
            KvCache::F16($c) => $body,
            KvCache::F32($c) => $body,
            KvCache::Q8_0($c) => $body,
            KvCache::Q4_0($c) => $body,
        }
    };
}

impl KvCache {
    /// An empty cache of up to `n_ctx` positions of `heads` KV heads of `hd` values. Panics unless `hd`
    /// is a multiple of the type's block ([`KvType::block`]; [`super::HParams::check_kv_type`] says so
    /// as an error).
    pub fn new(ty: KvType, n_ctx: usize, heads: usize, hd: usize) -> KvCache {
        assert!(
            hd.is_multiple_of(ty.block()),
            "KV heads of {hd} values are not whole {ty} blocks"
        );
        let units = hd / ty.block();
        match ty {
            KvType::F16 => KvCache::F16(KvPaged::new(n_ctx, heads, units)),
            KvType::F32 => KvCache::F32(KvPaged::new(n_ctx, heads, units)),
            KvType::Q8_0 => KvCache::Q8_0(KvPaged::new(n_ctx, heads, units)),
            KvType::Q4_0 => KvCache::Q4_0(KvPaged::new(n_ctx, heads, units)),
        }
    }

    pub fn kv_type(&self) -> KvType {
        match self {
            KvCache::F16(_) => KvType::F16,
            KvCache::F32(_) => KvType::F32,
            KvCache::Q8_0(_) => KvType::Q8_0,
            KvCache::Q4_0(_) => KvType::Q4_0,
        }
    }

    /// Positions stored.
    pub fn len(&self) -> usize {
        each_kv!(self, c => c.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions the cache may grow to.
    pub fn n_ctx(&self) -> usize {
        each_kv!(self, c => c.n_ctx)
    }

    /// Bytes allocated for keys and values.
    pub fn bytes(&self) -> usize {
        each_kv!(self, c => c.bytes())
    }

    fn push(&mut self, k: &[f32], v: &[f32]) {
        each_kv!(self, c => c.push(k, v))
    }

    /// Keeps the first `len` positions.
    pub(crate) fn truncate(&mut self, len: usize) {
        each_kv!(self, c => c.truncate(len))
    }

    /// Empties the cache, keeping its pages allocated.
    pub(crate) fn clear(&mut self) {
        each_kv!(self, c => c.clear())
    }
}

/// Rotates pairs `(i, i + n_rot/2)` of the first `n_rot` dims by `θ_i = pos · base^(−2i/n_rot)`; the rest
/// of the head is left alone. Angles in f64 so large positions keep their precision.
pub fn rope_neox(x: &mut [f32], pos: usize, n_rot: usize, base: f32) {
    let (cos, sin) = rope_cos_sin(pos, n_rot, base);
    rope(x, &cos, &sin);
}

/// The RoPE positions of a batch's rows. A position is `(t, h, w)` (spec §3.6); text has `t = h = w`,
/// which is plain 1-D RoPE. After an image the positions run behind the KV indices.
#[derive(Clone, Copy, Debug)]
pub enum RopePos<'a> {
    /// Row `r` at position `p0 + r` on every axis (text).
    Text(usize),
    /// Row `r` at `pos[r]` = `(t, h, w)` (a batch with image rows; interleaved M-RoPE).
    Mrope(&'a [[u32; 3]]),
}

impl RopePos<'_> {
    /// Cosines and sines of row `r`'s angles (`[n_rot/2]` each).
    fn cos_sin(self, r: usize, hp: &HParams) -> (Vec<f32>, Vec<f32>) {
        match self {
            RopePos::Text(p0) => hp.rope.cos_sin(p0 + r),
            RopePos::Mrope(pos) => {
                let p = pos[r];
                hp.rope.cos_sin_by(|i| p[hp.rope_axis(i)] as usize)
            }
        }
    }
}

/// `a`: `[T × d]` normed inputs at KV indices `pos0..pos0+T` and RoPE positions `rope`; writes the block
/// output `[T × d]` to `out`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    w: &AttentionWeights,
    hp: &HParams,
    il: usize,
    cache: &mut KvCache,
    pos0: usize,
    rope_pos: RopePos,
    a: &[f32],
    out: &mut [f32],
    arena: &mut Vec<f32>,
) {
    let (nh, nkv, hd) = (hp.n_head[il], hp.n_head_kv[il], hp.head_dim);
    let n_tok = a.len() / hp.n_embd;
    debug_assert_eq!(cache.len(), pos0, "KV cache and position out of step");
    // QG: [T × H × (q: hd | gate: hd)] — per-head interleaved, not [all q | all gates].
    // K, V: [T × Hkv × hd]; O: [T × H × hd].
    let [qg, k, v, o] = carve(
        arena,
        [
            n_tok * 2 * nh * hd,
            n_tok * nkv * hd,
            n_tok * nkv * hd,
            n_tok * nh * hd,
        ],
    );
    matmuls(
        a,
        n_tok,
        &mut [(&w.wq, &mut *qg), (&w.wk, &mut *k), (&w.wv, &mut *v)],
    );
    // q (the first half of every head's pair) normed and rotated in place; the gates stay where they are.
    // A quantized cache is stored rotated (q·k and Σ p·v are unchanged by an orthonormal rotation).
    let rot = KvRotation::of(cache.kv_type(), hd);
    for_rows(qg, 2 * nh * hd, |t, qg| {
        let (cos, sin) = rope_pos.cos_sin(t, hp);
        for pair in qg.chunks_exact_mut(2 * hd) {
            let dst = &mut pair[..hd];
            rms_norm(dst, &w.q_norm, hp.rms_eps);
            rope(dst, &cos, &sin);
            if let Some(rot) = rot {
                hadamard(dst, rot.k);
            }
        }
    });
    for_rows(k, nkv * hd, |t, k| {
        let (cos, sin) = rope_pos.cos_sin(t, hp);
        for k in k.chunks_exact_mut(hd) {
            rms_norm(k, &w.k_norm, hp.rms_eps);
            rope(k, &cos, &sin);
            if let Some(rot) = rot {
                hadamard(k, rot.k);
            }
        }
    });
    if let Some(rot) = rot {
        for_rows(v, nkv * hd, |_, v| hadamard(v, rot.v));
    }
    cache.push(k, v);

    // o[t][j] = Σ_τ softmax_τ(q·k_τ / √hd) v_τ over τ ≤ pos0 + t, KV head m = j / (H/Hkv).
    match cache {
        KvCache::F16(c) => attend_all(c, qg, nh, nkv, hd, pos0, o),
        KvCache::F32(c) => attend_all(c, qg, nh, nkv, hd, pos0, o),
        KvCache::Q8_0(c) => attend_all_blocks(c, qg, nh, nkv, hd, pos0, o),
        KvCache::Q4_0(c) => attend_all_blocks(c, qg, nh, nkv, hd, pos0, o),
    }
    for_rows(o, nh * hd, |t, o| {
        if let Some(rot) = rot {
            hadamard(o, rot.v); // back from the rotated values
        }
        for (j, o) in o.chunks_exact_mut(hd).enumerate() {
            sigmoid_mul(o, &qg[(t * nh + j) * 2 * hd + hd..][..hd]);
        }
    });
    matmul(&w.wo, o, n_tok, out);
}

/// Every query head of every new token (`qg`: `[T × H × (q | gate)]`, `o`: `[T × H × hd]`, token `t` at
/// position `pos0 + t`) against the cache, which already holds these tokens: causal, so token `t` sees
/// `pos0 + t + 1` positions.
fn attend_all<T: KvElem>(
    c: &KvPaged<T>,
    qg: &[f32],
    nh: usize,
    nkv: usize,
    hd: usize,
    pos0: usize,
    o: &mut [f32],
) {
    let scale = 1.0 / (hd as f32).sqrt();
    attend_tiles(qg, nh, nkv, hd, pos0, o, |m, qs, n_ctx, out| {
        attend_many_into(qs, n_ctx, c.head(m), scale, out)
    });
}

/// [`attend_all`] over a cache of blocks: the query quantized to Q8_0 for the key dot products, the
/// value rows dequantized as they are read ([`attend_quant_many`]).
fn attend_all_blocks<B: KvBlock>(
    c: &KvPaged<B>,
    qg: &[f32],
    nh: usize,
    nkv: usize,
    hd: usize,
    pos0: usize,
    o: &mut [f32],
) {
    let scale = 1.0 / (hd as f32).sqrt();
    attend_tiles(qg, nh, nkv, hd, pos0, o, |m, qs, n_ctx, out| {
        attend_quant_many_into(qs, n_ctx, c.head(m), scale, out)
    });
}

/// Tokens per attention tile: with a GQA group of 4 heads, 64 queries read each block of keys and
/// values while it is in cache.
const TILE_TOKENS: usize = 16;

/// Splits the queries into tiles that share a KV head (a few tokens × the heads of a GQA group), runs
/// `run(kv_head, queries, n_ctx, out)` on each in parallel and puts the results in `o`. When there are
/// fewer tiles than threads (decoding, the MTP verification), deep caches are split over the threads
/// by chunks of positions (split-K: every thread reads its own part of the KV head once, for all the
/// group's heads) and the partial softmaxes merged; shallow ones split a group's heads instead. Every
/// query is computed exactly as alone ([`attend_many`]: the chunks are the same whatever the split), so
/// the tiling never changes a bit of the output.
fn attend_tiles(
    qg: &[f32],
    nh: usize,
    nkv: usize,
    hd: usize,
    pos0: usize,
    o: &mut [f32],
    run: impl Fn(usize, &[f32], &[usize], AttnOut<'_>) + Sync,
) {
    let n_tok = o.len() / (nh * hd);
    let group = nh / nkv;
    let token_tiles = n_tok.div_ceil(TILE_TOKENS);
    let threads = rayon::current_num_threads();
    let n_chunks = (pos0 + n_tok).div_ceil(CHUNK);
    // Split-K parts per tile: enough to give every thread work, at most one per chunk.
    let parts = if nkv * token_tiles < threads {
        threads.div_ceil(nkv * token_tiles).min(n_chunks)
    } else {
        1
    };
    let mut heads = group;
    while parts == 1 && heads > 1 && nkv * token_tiles * group.div_ceil(heads) < threads {
        heads = heads.div_ceil(2);
    }
    let head_tiles = group.div_ceil(heads);
    // Tile (m, tt, ht): KV head m, tokens tt·16.., heads m·group + ht·heads.. of its group; its queries
    // token by token, the heads of each token together.
    let tiles: Vec<(usize, usize, usize)> = (0..nkv)
        .flat_map(|m| {
            (0..token_tiles).flat_map(move |tt| (0..head_tiles).map(move |ht| (m, tt, ht)))
        })
        .collect();
    let span = |&(m, tt, ht): &(usize, usize, usize)| {
        let toks = tt * TILE_TOKENS..((tt + 1) * TILE_TOKENS).min(n_tok);
        let hs = m * group + ht * heads..(m * group + (ht + 1) * heads).min((m + 1) * group);
        (toks, hs)
    };
    let queries = |tile: &(usize, usize, usize)| {
        let (toks, hs) = span(tile);
        let mut qs = Vec::with_capacity(toks.len() * hs.len() * hd);
        let mut n_ctx = Vec::with_capacity(toks.len() * hs.len());
        for t in toks {
            for j in hs.clone() {
                qs.extend_from_slice(&qg[(t * nh + j) * 2 * hd..][..hd]);
                n_ctx.push(pos0 + t + 1);
            }
        }
        (qs, n_ctx)
    };
    let results: Vec<Vec<f32>> = if parts == 1 {
        tiles
            .par_iter()
            .map(|tile| {
                let (qs, n_ctx) = queries(tile);
                let mut out = vec![0f32; qs.len()];
                run(tile.0, &qs, &n_ctx, AttnOut::Whole(&mut out));
                out
            })
            .collect()
    } else {
        // Per tile, the partials of all its chunks (`[n_chunks × nq]` stats, `[n_chunks × nq × hd]`
        // outputs); work item (tile, p) fills chunks p·n/parts .. (p+1)·n/parts of them.
        let first = |p: usize| p * n_chunks / parts;
        let mut partials: Vec<(Vec<ChunkStat>, Vec<f32>)> = tiles
            .iter()
            .map(|tile| {
                let (toks, hs) = span(tile);
                let nq = toks.len() * hs.len();
                (
                    vec![ChunkStat::EMPTY; n_chunks * nq],
                    vec![0f32; n_chunks * nq * hd],
                )
            })
            .collect();
        let mut items = Vec::with_capacity(tiles.len() * parts);
        for (i, (stats, part)) in partials.iter_mut().enumerate() {
            let nq = stats.len() / n_chunks;
            let (mut stats, mut part) = (&mut stats[..], &mut part[..]);
            for p in 0..parts {
                let nc = first(p + 1) - first(p);
                let (st, rest) = stats.split_at_mut(nc * nq);
                stats = rest;
                let (o, rest) = part.split_at_mut(nc * nq * hd);
                part = rest;
                items.push((i, first(p), st, o));
            }
        }
        items.into_par_iter().for_each(|(i, first, stats, o)| {
            let (qs, n_ctx) = queries(&tiles[i]);
            run(tiles[i].0, &qs, &n_ctx, AttnOut::Chunks { first, o, stats });
        });
        partials
            .iter()
            .map(|(stats, part)| {
                let mut out = vec![0f32; part.len() / n_chunks];
                merge_chunks(stats, part, &mut out);
                out
            })
            .collect()
    };
    for (tile, out) in tiles.iter().zip(&results) {
        let (toks, hs) = span(tile);
        let mut rows = out.chunks_exact(hd);
        for t in toks {
            for j in hs.clone() {
                o[(t * nh + j) * hd..][..hd]
                    .copy_from_slice(rows.next().expect("one row per query"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytemuck::Zeroable;

    #[test]
    fn rope_matches_formula() {
        let (n_rot, hd, base) = (64, 256, 1e7f32);
        for pos in [0usize, 1, 1000, 200_000] {
            let x: Vec<f32> = (0..hd)
                .map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0)
                .collect();
            let mut y = x.clone();
            rope_neox(&mut y, pos, n_rot, base);
            for i in 0..32 {
                let th = pos as f64 / (base as f64).powf(2.0 * i as f64 / 64.0);
                let (a, b) = (x[i] as f64, x[i + 32] as f64);
                assert!((y[i] as f64 - (a * th.cos() - b * th.sin())).abs() < 1e-6);
                assert!((y[i + 32] as f64 - (a * th.sin() + b * th.cos())).abs() < 1e-6);
            }
            assert_eq!(&y[64..], &x[64..]);
        }
    }

    fn hparams(n_rot: usize, sections: Option<[usize; 4]>) -> HParams {
        HParams {
            n_embd: 8,
            n_layer: 1,
            n_layer_all: 1,
            n_ctx_train: 64,
            kinds: vec![super::super::LayerKind::Attention],
            n_ff: vec![8],
            n_head: vec![1],
            n_head_kv: vec![1],
            head_dim: 256,
            rms_eps: 1e-6,
            n_rot,
            rope_base: 1e7,
            rope_scaling: Default::default(),
            rope: super::super::Rope::plain(n_rot, 1e7, 64),
            rope_sections: sections,
            conv_kernel: 4,
            n_k_heads: 1,
            n_v_heads: 1,
            d_k: 8,
            d_v: 8,
        }
    }

    /// Text positions (t = h = w) through the M-RoPE path are the 1-D rotation bit for bit; an image
    /// position takes t, h, w on the interleaved pairs (Qwen3.5's [11, 11, 10, 0] over 32 pairs).
    #[test]
    fn mrope_interleaves_and_reduces_to_text() {
        let hp = hparams(64, Some([11, 11, 10, 0]));
        hp.check_mrope().unwrap();
        for p in [0u32, 5, 1000, 200_000] {
            let text = RopePos::Text(p as usize).cos_sin(0, &hp);
            let pos = [[p; 3]];
            assert_eq!(RopePos::Mrope(&pos).cos_sin(0, &hp), text, "position {p}");
        }
        let axes: Vec<usize> = (0..32).map(|i| hp.rope_axis(i)).collect();
        let want: Vec<usize> = (0..32).map(|i| i % 3).collect(); // t, h, w, t, …: w ends at 29, h at 31
        assert_eq!(axes, want);
        let pos = [[7u32, 9, 11]];
        let (cos, _) = RopePos::Mrope(&pos).cos_sin(0, &hp);
        for (i, c) in cos.iter().enumerate() {
            let (want, _) = rope_cos_sin(pos[0][want[i]] as usize, 64, 1e7);
            assert_eq!(*c, want[i], "pair {i}");
        }
        // Sections that do not cover the pairs: text still runs, image positions are refused.
        assert!(hparams(16, Some([11, 11, 10, 0])).check_mrope().is_err());
        assert!(hparams(16, None).check_mrope().is_err());
        hparams(16, Some([3, 3, 2, 0])).check_mrope().unwrap();
    }

    fn rows(n: usize, row: usize, seed: f32) -> Vec<f32> {
        (0..n * row).map(|i| seed + i as f32 * 0.25).collect()
    }

    /// Pages fill in order whatever the batch sizes, the cache never holds room beyond `n_ctx`
    /// positions, and stored values are the inputs rounded to the element type.
    #[test]
    fn kv_pages_grow_to_n_ctx_exactly() {
        let row = 4;
        for ty in [KvType::F16, KvType::F32] {
            for n_ctx in [1, 7, KV_PAGE, KV_PAGE + 1, 3 * KV_PAGE - 5] {
                for batch in [1, 3, KV_PAGE - 1, KV_PAGE + 2, 1000] {
                    let mut c = KvCache::new(ty, n_ctx, 1, row);
                    let mut pos = 0;
                    while pos < n_ctx {
                        let n = batch.min(n_ctx - pos);
                        let (k, v) = (rows(n, row, pos as f32), rows(n, row, -(pos as f32)));
                        c.push(&k, &v);
                        pos += n;
                        assert_eq!(c.len(), pos);
                        let cap_rows = c.bytes() / (2 * ty.row_bytes(row));
                        assert!(cap_rows <= n_ctx, "{ty} n_ctx={n_ctx} batch={batch}");
                        assert!(cap_rows < pos + KV_PAGE, "{ty}: at most one page ahead");
                    }
                    // Full: exactly n_ctx positions allocated.
                    assert_eq!(c.bytes(), 2 * n_ctx * ty.row_bytes(row));
                    // Element e of position p in a batch starting at position b is
                    // b + ((p − b)·row + e)·0.25: position 1, element 1 below.
                    let (page0, pages): (Vec<f32>, usize) = match &c {
                        KvCache::F16(p) => {
                            (p.k[0][0].iter().map(|x| x.to_f32()).collect(), p.k[0].len())
                        }
                        KvCache::F32(p) => (p.k[0][0].clone(), p.k[0].len()),
                        _ => unreachable!("float types only"),
                    };
                    if n_ctx > 1 {
                        let k0: f32 = page0[row + 1];
                        let want = if batch == 1 {
                            1.25
                        } else {
                            (row + 1) as f32 * 0.25
                        };
                        assert_eq!(k0, want, "{ty} n_ctx={n_ctx} batch={batch}");
                    }
                    assert_eq!(pages, n_ctx.div_ceil(KV_PAGE));
                }
            }
        }
    }

    /// Each KV head's rows lie back to back in pages of its own: head `m`'s view holds, at position `p`,
    /// elements `m·hd..(m+1)·hd` of the pushed row `p`, across pages and after a truncation.
    #[test]
    fn kv_heads_have_pages_of_their_own() {
        let (heads, hd, n_ctx) = (3, 4, 2 * KV_PAGE + 7);
        let row = heads * hd;
        let mut c = KvCache::new(KvType::F32, n_ctx, heads, hd);
        let (k, v) = (rows(n_ctx, row, 0.0), rows(n_ctx, row, -1.0));
        c.push(&k[..5 * row], &v[..5 * row]);
        c.push(&k[5 * row..], &v[5 * row..]);
        c.truncate(KV_PAGE + 3);
        c.push(&k[(KV_PAGE + 3) * row..], &v[(KV_PAGE + 3) * row..]);
        let KvCache::F32(p) = &c else { unreachable!() };
        for m in 0..heads {
            let view = p.head(m);
            assert_eq!((view.stride, view.offset), (hd, 0));
            for pos in [0, 4, 5, KV_PAGE - 1, KV_PAGE, KV_PAGE + 3, n_ctx - 1] {
                let (page, at) = (pos / KV_PAGE, (pos % KV_PAGE) * hd);
                let want = |x: &[f32]| x[pos * row + m * hd..][..hd].to_vec();
                assert_eq!(
                    view.k[page][at..at + hd],
                    want(&k)[..],
                    "head {m} pos {pos}"
                );
                assert_eq!(
                    view.v[page][at..at + hd],
                    want(&v)[..],
                    "head {m} pos {pos}"
                );
            }
        }
    }

    /// Split-K: with fewer tiles than threads a deep cache is split over the threads by chunks, and the
    /// outputs keep the bits of one thread (and of a prefill tile holding the same token): for every
    /// cache type, 1 token (decoding) and 3 (a verification) after 2·CHUNK + 100 positions.
    #[test]
    fn split_k_keeps_the_bits_of_one_thread() {
        let (nh, nkv, hd) = (8, 2, 64);
        let depth = 2 * CHUNK + 100;
        let in_pool = |threads: usize, f: &mut (dyn FnMut() + Send)| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(f)
        };
        for ty in [KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0] {
            let n_all = depth + 3;
            let mut c = KvCache::new(ty, n_all, nkv, hd);
            let wave = |n: usize, seed: f32| -> Vec<f32> {
                (0..n)
                    .map(|i| (i as f32 * 0.37 + seed).sin() * 0.9)
                    .collect()
            };
            c.push(&wave(n_all * nkv * hd, 0.1), &wave(n_all * nkv * hd, 2.0));
            let qg = wave(3 * nh * 2 * hd, 5.0);
            // Tokens `t0..t0 + n_tok` of `qg` at positions `pos0..`.
            let run = |t0: usize, n_tok: usize, pos0: usize, threads: usize| {
                let mut o = vec![f32::NAN; n_tok * nh * hd];
                let qg = &qg[t0 * nh * 2 * hd..(t0 + n_tok) * nh * 2 * hd];
                in_pool(threads, &mut || match &c {
                    KvCache::F16(p) => attend_all(p, qg, nh, nkv, hd, pos0, &mut o),
                    KvCache::F32(p) => attend_all(p, qg, nh, nkv, hd, pos0, &mut o),
                    KvCache::Q8_0(p) => attend_all_blocks(p, qg, nh, nkv, hd, pos0, &mut o),
                    KvCache::Q4_0(p) => attend_all_blocks(p, qg, nh, nkv, hd, pos0, &mut o),
                });
                o
            };
            for n_tok in [1, 3] {
                let pos0 = n_all - n_tok;
                let one = run(0, n_tok, pos0, 1);
                assert!(one.iter().all(|x| x.is_finite()));
                for threads in [2, 4, 7] {
                    assert_eq!(
                        one,
                        run(0, n_tok, pos0, threads),
                        "{ty}, {n_tok} tokens, {threads} threads"
                    );
                }
            }
            // The last token alone equals the last of the three.
            let three = run(0, 3, depth, 1);
            assert_eq!(&three[2 * nh * hd..], &run(2, 1, depth + 2, 4)[..], "{ty}");
        }
    }

    /// Q8_0 and Q4_0 caches hold ggml's blocks of each row (34 and 18 bytes per 32 values), grow page
    /// by page to exactly `n_ctx` positions, and truncate to whole positions.
    #[test]
    fn block_caches_store_quantized_rows() {
        use crate::quant::BlockFormat;
        let (row, n_ctx) = (64, KV_PAGE + 9);
        for ty in [KvType::Q8_0, KvType::Q4_0] {
            let mut c = KvCache::new(ty, n_ctx, 1, row);
            let k: Vec<f32> = (0..n_ctx * row)
                .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
                .collect();
            c.push(&k[..3 * row], &k[..3 * row]);
            c.push(&k[3 * row..], &k[3 * row..]);
            assert_eq!(c.len(), n_ctx);
            assert_eq!(c.bytes(), 2 * n_ctx * ty.row_bytes(row), "{ty}");
            let check = |c: &KvCache, pos: usize| {
                let r = &k[pos * row..][..row];
                let got = match c {
                    KvCache::Q8_0(p) => {
                        let mut want = vec![BlockQ8_0::zeroed(); 2];
                        BlockQ8_0::quantize(r, &mut want);
                        bytemuck::cast_slice::<_, u8>(
                            &p.k[0][pos / KV_PAGE][(pos % KV_PAGE) * 2..][..2],
                        ) == bytemuck::cast_slice::<_, u8>(&want)
                    }
                    KvCache::Q4_0(p) => {
                        let mut want = vec![BlockQ4_0::zeroed(); 2];
                        BlockQ4_0::quantize(r, &mut want);
                        bytemuck::cast_slice::<_, u8>(
                            &p.v[0][pos / KV_PAGE][(pos % KV_PAGE) * 2..][..2],
                        ) == bytemuck::cast_slice::<_, u8>(&want)
                    }
                    _ => unreachable!(),
                };
                assert!(got, "{ty}: position {pos}");
            };
            for pos in [0, 2, 3, KV_PAGE - 1, KV_PAGE, n_ctx - 1] {
                check(&c, pos);
            }
            c.truncate(KV_PAGE + 1);
            assert_eq!(c.len(), KV_PAGE + 1);
            c.push(&k[(KV_PAGE + 1) * row..], &k[(KV_PAGE + 1) * row..]);
            check(&c, n_ctx - 1);
        }
    }

    /// A clone (a snapshot) holds only the positions in use; growing it again gives its last page back
    /// its full size and the same contents as the original grown the same way.
    #[test]
    fn kv_snapshot_is_trimmed_and_regrows() {
        let (row, n_ctx) = (8, 2 * KV_PAGE);
        let mut c = KvCache::new(KvType::F16, n_ctx, 1, row);
        c.push(&rows(10, row, 1.0), &rows(10, row, 2.0));
        assert_eq!(c.bytes(), 2 * KV_PAGE * row * 2);
        let mut snap = c.clone();
        assert_eq!(snap.bytes(), 2 * 10 * row * 2);
        for x in [&mut c, &mut snap] {
            x.push(&rows(300, row, 3.0), &rows(300, row, 4.0));
        }
        assert_eq!(snap.bytes(), c.bytes());
        match (&c, &snap) {
            (KvCache::F16(a), KvCache::F16(b)) => assert_eq!((&a.k, &a.v), (&b.k, &b.v)),
            _ => unreachable!(),
        }
    }

    /// The fast transform is llama.cpp's Sylvester matrix (entries ±1/√n) applied as a product, and
    /// applying it twice gives back the input.
    #[test]
    fn hadamard_is_the_sylvester_rotation() {
        for n in [64usize, 128, 256] {
            let x: Vec<f32> = (0..2 * n)
                .map(|i| ((i * 29) % 53) as f32 / 7.0 - 3.0)
                .collect();
            let mut h = vec![0f32; n * n];
            h[0] = (1.0 / f64::from((n as f32).sqrt())) as f32;
            let mut s = 1;
            while s < n {
                for i in 0..s {
                    for j in 0..s {
                        let v = h[i * n + j];
                        h[(i + s) * n + j] = v;
                        h[i * n + j + s] = v;
                        h[(i + s) * n + j + s] = -v;
                    }
                }
                s *= 2;
            }
            let mut y = x.clone();
            hadamard(&mut y, n);
            for (c, (xc, yc)) in x.chunks(n).zip(y.chunks(n)).enumerate() {
                for i in 0..n {
                    let want: f64 = (0..n)
                        .map(|j| f64::from(h[i * n + j]) * f64::from(xc[j]))
                        .sum();
                    assert!(
                        (f64::from(yc[i]) - want).abs() < 1e-5,
                        "n={n} chunk {c} row {i}"
                    );
                }
            }
            hadamard(&mut y, n);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-5, "n={n}: H·H ≠ I");
            }
        }
    }

    /// Quantized caches are rotated by the largest power of two dividing the head (keys) and by 64
    /// (values); float caches and heads not a multiple of 64 are not (llama.cpp's rule).
    #[test]
    fn rotation_follows_llama_cpp() {
        assert_eq!(
            KvRotation::of(KvType::Q4_0, 256),
            Some(KvRotation { k: 256, v: 64 })
        );
        assert_eq!(
            KvRotation::of(KvType::Q8_0, 192),
            Some(KvRotation { k: 64, v: 64 })
        );
        assert_eq!(
            KvRotation::of(KvType::Q8_0, 128),
            Some(KvRotation { k: 128, v: 64 })
        );
        assert_eq!(KvRotation::of(KvType::Q4_0, 96), None);
        assert_eq!(KvRotation::of(KvType::F16, 256), None);
        assert_eq!(KvRotation::of(KvType::F32, 256), None);
    }

    /// What the rotation is for: a row with one outlier channel loses less to Q4_0 when rotated first
    /// (the outlier no longer sets the scale of its whole block alone).
    #[test]
    fn rotation_lowers_q4_0_error_on_outliers() {
        use crate::quant::BlockFormat;
        let n = 256;
        let x: Vec<f32> = (0..n)
            .map(|i| {
                if i == 5 {
                    40.0
                } else {
                    ((i * 37) % 101) as f32 / 50.0 - 1.0
                }
            })
            .collect();
        let q4_err = |x: &[f32]| {
            let mut b = vec![BlockQ4_0::zeroed(); n / 32];
            BlockQ4_0::quantize(x, &mut b);
            let mut y = vec![0f32; n];
            BlockQ4_0::dequantize(&b, &mut y);
            (x.to_vec(), y)
        };
        let (x0, y0) = q4_err(&x);
        let plain: f32 = x0.iter().zip(&y0).map(|(a, b)| (a - b) * (a - b)).sum();
        let mut r = x.clone();
        hadamard(&mut r, n);
        let (_, mut y1) = q4_err(&r);
        hadamard(&mut y1, n);
        let rotated: f32 = x.iter().zip(&y1).map(|(a, b)| (a - b) * (a - b)).sum();
        assert!(rotated < 0.75 * plain, "rotated {rotated} vs plain {plain}");
    }
}
