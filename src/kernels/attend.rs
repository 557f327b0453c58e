//! One query's attention over a KV cache with a streaming (online) softmax: scores are made a block of
//! positions at a time and the running output is rescaled when the maximum grows, so no buffer the size
//! of the context is needed.
//!
//! The cache is stored in pages of positions ([`KvPages`]) of f32 or f16 elements ([`KvElem`]); f16 rows
//! are widened to f32 exactly as they are read, and all arithmetic is f32 (the normalizer f64). The
//! kernel table ([`Kernels::attend_f32`](super::Kernels), `attend_f16`) holds one entry per element type:
//! the scalar reference [`attend_ref`], AVX2 + FMA + F16C (`_mm256_cvtph_ps`) and NEON (`fcvtl`).

use half::f16;

use super::dispatch::Kernels;

/// Positions per block of scores.
pub(crate) const BLOCK: usize = 128;

/// Positions per chunk of the softmax (a multiple of [`BLOCK`]). Every query's positions are cut at the
/// multiples of `CHUNK`; each chunk's streaming softmax starts afresh and the chunks are merged in order
/// ([`merge_chunk`]). So decoding deep in the cache can run a query's chunks on different threads
/// (split-K, [`attend_many_into`] with [`AttnOut::Chunks`]) and still get the bits of one thread, of a prefill tile and of the
/// MTP verification. A context within one chunk runs exactly as one streaming softmax.
pub const CHUNK: usize = 2048;

/// Rows ahead of the one being read that the SIMD score tiles prefetch (decoding reads every row once,
/// straight from memory, and the hardware prefetcher does not keep up with one KV head's rows).
pub(crate) const PF_ROWS: usize = 16;

/// Calls `fetch` with the address of every 64-byte line of `n` rows of `len` elements, `stride` apart,
/// the first `at` elements after `p`: the per-ISA tiles pass their prefetch instruction. The addresses may
/// lie past the slice `p` points into (a prefetch never faults), so they are computed with wrapping
/// arithmetic and never dereferenced here.
#[inline(always)]
pub(crate) fn for_row_lines<T>(
    p: *const T,
    at: usize,
    n: usize,
    stride: usize,
    len: usize,
    mut fetch: impl FnMut(*const u8),
) {
    for t in 0..n {
        let row = p.wrapping_add(at + t * stride) as *const u8;
        for b in (0..len * size_of::<T>()).step_by(64) {
            fetch(row.wrapping_add(b));
        }
    }
}

/// One query's softmax over one chunk: the largest scaled score and `Σ e^{s − max}` (0: no positions).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkStat {
    pub max: f32,
    pub sum: f64,
}

impl ChunkStat {
    /// No positions seen.
    pub const EMPTY: ChunkStat = ChunkStat {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };
}

/// Where a several-query call puts its results.
pub enum AttnOut<'a> {
    /// Every query's output, `[nq × hd]`.
    Whole(&'a mut [f32]),
    /// Split-K: chunks `first..first + n` of every query, unmerged: `o[(c·nq + i)·hd..][..hd]` is query
    /// `i`'s unnormalized `Σ e^{s − max}·v` over chunk `first + c` and `stats[c·nq + i]` its max and sum
    /// (`n = stats.len() / nq`). [`merge_chunks`] makes the outputs.
    Chunks {
        first: usize,
        o: &'a mut [f32],
        stats: &'a mut [ChunkStat],
    },
}

impl AttnOut<'_> {
    /// The output values it holds (all chunks' for [`AttnOut::Chunks`]), for shape checks.
    fn len(&self) -> usize {
        match self {
            AttnOut::Whole(o) => o.len(),
            AttnOut::Chunks { o, .. } => o.len(),
        }
    }
}

/// A KV cache's keys and values as seen by one query head: position `τ` lives in page
/// `τ / page_rows` at row `τ % page_rows`, and its head vector is `page[row·stride + offset..][..hd]`.
/// Every page but the last holds `page_rows` positions.
#[derive(Clone, Copy, Debug)]
pub struct KvPages<'a, T> {
    pub k: &'a [Vec<T>],
    pub v: &'a [Vec<T>],
    /// Positions per page (≥ 1).
    pub page_rows: usize,
    /// Elements from one position to the next within a page.
    pub stride: usize,
    /// First element of this head within a position's row.
    pub offset: usize,
}

impl<'a, T> KvPages<'a, T> {
    /// One contiguous buffer of positions `stride` elements apart (a single page).
    pub fn contiguous(
        k: &'a [Vec<T>],
        v: &'a [Vec<T>],
        n_ctx: usize,
        stride: usize,
        offset: usize,
    ) -> KvPages<'a, T> {
        KvPages {
            k,
            v,
            page_rows: n_ctx.max(1),
            stride,
            offset,
        }
    }

    /// Panics unless positions `0..n_ctx` with `hd` elements (or blocks) each are inside the pages:
    /// after this every row the kernels index exists (they still index through checked slices).
    pub(crate) fn check(&self, hd: usize, n_ctx: usize) {
        assert!(n_ctx > 0, "attention over an empty context");
        assert!(self.page_rows > 0, "attend: pages of zero positions");
        assert!(
            self.offset + hd <= self.stride,
            "attend: head outside the row"
        );
        let pages = n_ctx.div_ceil(self.page_rows);
        assert!(
            self.k.len() >= pages && self.v.len() >= pages,
            "attend: {pages} pages needed, cache has {} / {}",
            self.k.len(),
            self.v.len()
        );
        for p in 0..pages {
            let rows = self.page_rows.min(n_ctx - p * self.page_rows);
            let need = (rows - 1) * self.stride + self.offset + hd;
            assert!(
                self.k[p].len() >= need && self.v[p].len() >= need,
                "attend: page {p} is too short"
            );
        }
    }
}

/// What a KV cache can be stored as: a float element type, or a block format
/// ([`super::attend_quant::KvBlock`]).
pub trait KvStore: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// Values per stored unit (1 for an element type, the block size for a block format).
    const PER: usize;
    /// Appends `src` (a whole number of units), rounded to this type (round to nearest even for
    /// f16, ggml's reference quantizer for blocks), to `dst`.
    fn extend_from_f32(dst: &mut Vec<Self>, src: &[f32]);
}

/// An element type the KV cache can be stored in.
pub trait KvElem: KvStore + Default {
    fn to_f32(self) -> f32;
    /// This type's entry in a kernel table.
    fn attend_entry(k: &Kernels) -> AttendFn<Self>;
    /// This type's several-query entry in a kernel table.
    fn attend_many_entry(k: &Kernels) -> AttendManyFn<Self>;
}

/// A kernel table's attention entry for element type `T`: see [`attend`].
pub type AttendFn<T> = fn(q: &[f32], kv: KvPages<'_, T>, n_ctx: usize, scale: f32, out: &mut [f32]);

/// A kernel table's entry for several queries over the same KV head: see [`attend_many`].
pub type AttendManyFn<T> =
    fn(qs: &[f32], n_ctx: &[usize], kv: KvPages<'_, T>, scale: f32, out: AttnOut<'_>);

impl KvStore for f32 {
    const PER: usize = 1;
    fn extend_from_f32(dst: &mut Vec<f32>, src: &[f32]) {
        dst.extend_from_slice(src);
    }
}

impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    fn attend_entry(k: &Kernels) -> AttendFn<f32> {
        k.attend_f32
    }
    fn attend_many_entry(k: &Kernels) -> AttendManyFn<f32> {
        k.attend_many_f32
    }
}

impl KvStore for f16 {
    const PER: usize = 1;
    fn extend_from_f32(dst: &mut Vec<f16>, src: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        let at = dst.len();
        dst.resize(at + src.len(), f16::ZERO);
        dst[at..].convert_from_f32_slice(src);
    }
}

impl KvElem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn attend_entry(k: &Kernels) -> AttendFn<f16> {
        k.attend_f16
    }
    fn attend_many_entry(k: &Kernels) -> AttendManyFn<f16> {
        k.attend_many_f16
    }
}

/// `out = Σ_τ softmax_τ(scale · q·k_τ) v_τ` over `τ < n_ctx` (`hd = q.len() = out.len()`), through the
/// kernel table chosen for this CPU. The normalizer is summed in f64.
pub fn attend<T: KvElem>(q: &[f32], kv: KvPages<'_, T>, n_ctx: usize, scale: f32, out: &mut [f32]) {
    // Weights of distant, low-scoring keys are subnormal (see `fpenv`).
    let _ftz = super::fpenv::FlushDenormals::new();
    T::attend_entry(super::kernels())(q, kv, n_ctx, scale, out)
}

/// The scalar reference of every table's attention entry.
pub fn attend_ref<T: KvElem>(
    q: &[f32],
    kv: KvPages<'_, T>,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    attend_many_ref(q, &[n_ctx], kv, scale, AttnOut::Whole(out))
}

/// [`attend`] for `n_ctx.len()` queries over the same KV head at once: query `i` is
/// `qs[i·hd..][..hd]`, sees the first `n_ctx[i]` positions and writes `out[i·hd..][..hd]`. Each block of
/// keys and values is read once for all the queries (from cache for all but the first), which is what
/// makes prefill at depth and GQA groups cheap; every query's result is bit-identical to [`attend`]'s.
pub fn attend_many<T: KvElem>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: &mut [f32],
) {
    attend_many_into(qs, n_ctx, kv, scale, AttnOut::Whole(out))
}

/// [`attend_many`] into any [`AttnOut`]: with [`AttnOut::Chunks`], the unmerged partials of some chunks
/// (split-K). Calls over disjoint chunk ranges can run on different threads; [`merge_chunks`] over all
/// chunks then gives [`attend_many`]'s bits.
pub fn attend_many_into<T: KvElem>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: AttnOut<'_>,
) {
    let _ftz = super::fpenv::FlushDenormals::new();
    T::attend_many_entry(super::kernels())(qs, n_ctx, kv, scale, out)
}

/// The outputs `out` (`[nq × hd]`) of `nq` queries from all their chunk partials (`stats`: `[n × nq]`,
/// `o`: `[n × nq × hd]`, chunk 0 first), as the whole softmax merges them: the same bits.
pub fn merge_chunks(stats: &[ChunkStat], o: &[f32], out: &mut [f32]) {
    let _ftz = super::fpenv::FlushDenormals::new();
    // Chunks, then queries per chunk.
    let n = o.len().checked_div(out.len()).unwrap_or(0);
    let nq = stats.len().checked_div(n).unwrap_or(0);
    assert!(
        nq > 0 && out.len().is_multiple_of(nq) && stats.len() * (out.len() / nq) == o.len(),
        "merge_chunks: {} stats, {} partial and {} output values",
        stats.len(),
        o.len(),
        out.len()
    );
    let hd = out.len() / nq;
    let mut run = vec![ChunkStat::EMPTY; nq];
    for (st, o) in stats.chunks_exact(nq).zip(o.chunks_exact(nq * hd)) {
        for (i, (st, o)) in st.iter().zip(o.chunks_exact(hd)).enumerate() {
            merge_chunk(&mut run[i], &mut out[i * hd..][..hd], *st, o);
        }
    }
    normalize(&run, out);
}

/// Folds one chunk's partial (`part`, unnormalized `o`) into a query's running softmax (`run`,
/// `o_run`), moving both to the larger maximum. The first chunk is taken as it is.
#[inline]
pub(crate) fn merge_chunk(run: &mut ChunkStat, o_run: &mut [f32], part: ChunkStat, o: &[f32]) {
    if part.sum == 0.0 {
        return; // the query sees no position of this chunk
    }
    if run.sum == 0.0 {
        *run = part;
        o_run.copy_from_slice(o);
        return;
    }
    let max = run.max.max(part.max);
    let (a, b) = ((run.max - max).exp(), (part.max - max).exp());
    for (x, &y) in o_run.iter_mut().zip(o) {
        *x = *x * a + y * b;
    }
    run.sum = run.sum * a as f64 + part.sum * b as f64;
    run.max = max;
}

/// `out_i ← out_i / sum_i` for every query.
fn normalize(run: &[ChunkStat], out: &mut [f32]) {
    let hd = out.len() / run.len();
    for (st, out) in run.iter().zip(out.chunks_exact_mut(hd)) {
        let inv = (1.0 / st.sum) as f32;
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

/// The scalar reference of every table's several-query entry.
pub fn attend_many_ref<T: KvElem>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: AttnOut<'_>,
) {
    let hd = check_many(qs, n_ctx, &kv, &out);
    body_grouped(
        qs,
        n_ctx,
        kv,
        scale,
        out,
        GROUP,
        |_, qs, k, _, stride, s, r| {
            for (q, s) in qs.chunks_exact(hd).zip(s.iter_mut()) {
                for (t, s) in s[..r].iter_mut().enumerate() {
                    *s = dot_ref(q, &k[t * stride..][..hd]);
                }
            }
        },
        weights_ref,
        values_ref,
    )
}

/// The scalar table's softmax weights step ([`AttendSteps::weights`](super::dispatch::AttendSteps)):
/// `e^{s − max}` by `f32::exp`, each added to the normalizer in f64.
pub fn weights_ref(s: &mut [f32], max: f32, sum: &mut f64) {
    for w in s.iter_mut() {
        *w = (*w - max).exp();
        *sum += *w as f64;
    }
}

/// The reference values step (the scalar table's [`AttendSteps::values`](super::dispatch::AttendSteps)
/// over f32 rows): every query's output row by row through `axpy`.
pub fn values_ref<T: KvElem>(
    out: &mut [f32],
    w: &[[f32; BLOCK]],
    v: &[T],
    stride: usize,
    r: usize,
) {
    let hd = out.len() / w.len();
    for (out, w) in out.chunks_exact_mut(hd).zip(w) {
        for (i, &w) in w[..r].iter().enumerate() {
            axpy_ref(out, w, &v[i * stride..][..hd]);
        }
    }
}

/// Shape checks of a several-query entry; returns the head length.
pub(crate) fn check_many<T>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: &KvPages<'_, T>,
    out: &AttnOut<'_>,
) -> usize {
    let nq = n_ctx.len();
    assert!(nq > 0, "attend_many: no queries");
    let hd = qs.len() / nq;
    assert!(
        hd * nq == qs.len(),
        "attend_many: {nq} queries of {} values",
        qs.len()
    );
    check_out(out, nq, qs.len());
    kv.check(hd, n_ctx.iter().copied().max().unwrap_or(0));
    hd
}

/// Panics unless `out` holds what `nq` queries of `n_values` values in all need.
pub(crate) fn check_out(out: &AttnOut<'_>, nq: usize, n_values: usize) {
    let per_query = match out {
        AttnOut::Whole(_) => 1,
        AttnOut::Chunks { stats, .. } => {
            assert!(
                !stats.is_empty() && stats.len().is_multiple_of(nq),
                "attend_many: {} chunk stats for {nq} queries",
                stats.len()
            );
            stats.len() / nq
        }
    };
    assert!(
        out.len() == n_values * per_query,
        "attend_many: {nq} queries of {n_values} values in all, {} output values",
        out.len()
    );
}

/// `Σ a_i · b_i` in the association of an 8-lane SIMD dot product ([`super::ops::dot_widened`]).
fn dot_ref<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    super::ops::dot_widened(a, b, T::to_f32)
}

/// `y ← y + a·x`
fn axpy_ref<T: KvElem>(y: &mut [f32], a: f32, x: &[T]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x.to_f32();
    }
}

/// Queries per group in [`body_grouped`] for most kernels.
pub(crate) const GROUP: usize = 8;

/// The most queries per group [`body_grouped`] takes (AVX-512's f16/f32 tiles use 16: two score tiles of
/// 8 queries share each load of a key row from L2, see `x86::attend`).
pub(crate) const GROUP_MAX: usize = 16;

/// The streaming softmax of several queries over an element cache (`hd = qs.len() / n_ctx.len()`),
/// for kernels that serve up to `group` (at most [`GROUP_MAX`]) queries from each load of a key or value
/// row. Within a block of positions, consecutive queries that see the same rows of it (the heads of one
/// token, or every query far from the causal edge) form a group:
/// - `scores(i0, qs, k, stride, s, r)`: `s[j][..r]` = the raw dot products of query `i0 + j`, the
///   group's `j`-th (`qs` holds the group's queries, `hd` values each), with key rows
///   `k[i·stride..][..hd]` (`hd` units of the cache), `i < r`;
/// - `weights(s, max, sum)`: `s ← e^{s − max}` in place, and their sum added to the normalizer `sum`;
/// - `values(out, w, v, stride, r)`: `out_j ← out_j + Σ_{i<r} w[j][i]·v_i` for the group's outputs, each
///   element taking the rows in order.
///
/// Each query's arithmetic must not depend on the group it is in (kernels give every (query, row) pair
/// the same operations whatever the group size): then one query alone (`n_ctx.len() == 1`) gets the
/// same bits as in any tile, which is what keeps decoding, verification and prefill consistent.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn body_grouped<T: Copy>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, T>,
    scale: f32,
    out: AttnOut<'_>,
    group: usize,
    mut scores: impl FnMut(usize, &[f32], &[T], &[T], usize, &mut [[f32; BLOCK]], usize),
    weights: impl Fn(&mut [f32], f32, &mut f64),
    mut values: impl FnMut(&mut [f32], &[[f32; BLOCK]], &[T], usize, usize),
) {
    assert!(
        (1..=GROUP_MAX).contains(&group),
        "body_grouped: group of {group}"
    );
    let nq = n_ctx.len();
    let hd = qs.len() / nq;
    let n_all = n_ctx.iter().copied().max().unwrap_or(0);
    // The tiles load each 64 bytes of a query again for every few key rows, and a Vec is only 16-byte
    // aligned: unless it happens to be 64-byte aligned, every such load spans two cache lines. An
    // aligned copy costs one pass over the queries (attend_probe 16384 16: 82.5 -> 84.2 GFLOP/s).
    let copy: Vec<Line>;
    let qs = if qs.as_ptr().align_offset(64) == 0 {
        qs
    } else {
        copy = Line::copy_of(qs);
        &bytemuck::cast_slice::<Line, f32>(&copy)[..qs.len()]
    };
    let mut s = [[0f32; BLOCK]; GROUP_MAX];
    // The streaming softmax over the blocks starting in `lo..hi`: a function rather than a closure, so
    // that it is inlined into the kernel's `#[target_feature]` function and compiled with its features
    // (a closure written here is compiled for the baseline ISA, and was called: scaling and maxima
    // ran in SSE).
    macro_rules! stream {
        ($lo:expr, $hi:expr, $acc:expr, $state:expr) => {
            stream_blocks(
                qs,
                n_ctx,
                &kv,
                scale,
                ($lo, $hi),
                group,
                $acc,
                $state,
                &mut s,
                &mut scores,
                &weights,
                &mut values,
            )
        };
    }
    let n_chunks = n_all.div_ceil(CHUNK);
    match out {
        AttnOut::Whole(out) if n_chunks <= 1 => {
            let mut state = vec![ChunkStat::EMPTY; nq];
            stream!(0, n_all, out, &mut state);
            normalize(&state, out);
        }
        AttnOut::Whole(out) => {
            // Chunk by chunk, each merged as it ends: the fold `merge_chunks` makes of split-K partials.
            let mut acc = vec![0f32; nq * hd];
            let mut state = vec![ChunkStat::EMPTY; nq];
            let mut run = vec![ChunkStat::EMPTY; nq];
            out.fill(0.0);
            for c in 0..n_chunks {
                stream!(c * CHUNK, (c + 1) * CHUNK, &mut acc, &mut state);
                for (i, (st, o)) in state.iter().zip(acc.chunks_exact(hd)).enumerate() {
                    merge_chunk(&mut run[i], &mut out[i * hd..][..hd], *st, o);
                }
            }
            normalize(&run, out);
        }
        AttnOut::Chunks { first, o, stats } => {
            for (c, (o, st)) in o
                .chunks_exact_mut(nq * hd)
                .zip(stats.chunks_exact_mut(nq))
                .enumerate()
            {
                let lo = (first + c) * CHUNK;
                stream!(lo, lo + CHUNK, o, st);
            }
        }
    }
}

/// The streaming softmax of every query over the blocks starting in positions `lo..hi`, into `acc`
/// (zeroed here) and `state`: [`body_grouped`]'s loop over blocks.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn stream_blocks<T: Copy>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: &KvPages<'_, T>,
    scale: f32,
    (lo, hi): (usize, usize),
    group: usize,
    acc: &mut [f32],
    state: &mut [ChunkStat],
    s: &mut [[f32; BLOCK]; GROUP_MAX],
    scores: &mut impl FnMut(usize, &[f32], &[T], &[T], usize, &mut [[f32; BLOCK]], usize),
    weights: &impl Fn(&mut [f32], f32, &mut f64),
    values: &mut impl FnMut(&mut [f32], &[[f32; BLOCK]], &[T], usize, usize),
) {
    let (stride, off, page_rows) = (kv.stride, kv.offset, kv.page_rows);
    let nq = n_ctx.len();
    let hd = qs.len() / nq;
    let n_all = n_ctx.iter().copied().max().unwrap_or(0);
    acc.fill(0.0);
    state.fill(ChunkStat::EMPTY);
    for_each_block(kv, n_all, lo, hi, |kp, vp, p0, b0, rows| {
        // Rows of this block query `i` sees (as it would count them alone), 0 if none.
        let seen = |i: usize| {
            page_rows
                .min(n_ctx[i].saturating_sub(p0))
                .saturating_sub(b0)
                .min(rows)
        };
        let mut i = 0;
        while i < nq {
            let r = seen(i);
            if r == 0 {
                i += 1;
                continue;
            }
            let mut g = 1;
            while g < group && i + g < nq && seen(i + g) == r {
                g += 1;
            }
            let (k, v) = (&kp[b0 * stride + off..], &vp[b0 * stride + off..]);
            scores(i, &qs[i * hd..(i + g) * hd], k, v, stride, &mut s[..g], r);
            let outs = &mut acc[i * hd..(i + g) * hd];
            for ((s, st), out) in s[..g]
                .iter_mut()
                .zip(&mut state[i..i + g])
                .zip(outs.chunks_exact_mut(hd))
            {
                let s = &mut s[..r];
                let block_max = scale_max(s, scale);
                if block_max > st.max {
                    // Everything so far was weighted by e^{−max}; move it to the new maximum.
                    let c = (st.max - block_max).exp();
                    out.iter_mut().for_each(|o| *o *= c);
                    st.sum *= c as f64;
                    st.max = block_max;
                }
                weights(s, st.max, &mut st.sum);
            }
            values(outs, &s[..g], v, stride, r);
            i += g;
        }
    });
}

/// 64 bytes of f32, aligned to a cache line.
#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(64))]
struct Line([f32; 16]);

impl Line {
    /// `x` in lines (the last one padded with zeros).
    fn copy_of(x: &[f32]) -> Vec<Line> {
        let mut v = vec![Line([0.0; 16]); x.len().div_ceil(16)];
        bytemuck::cast_slice_mut::<Line, f32>(&mut v)[..x.len()].copy_from_slice(x);
        v
    }
}

/// Rows `0..r` of the block at `src` (`stride` blocks apart, `nb` blocks each) converted back to back,
/// `per` units of `U` each, kept while the block is the same.
pub(crate) struct Gathered<U> {
    /// The block's first unit (its identity; never dereferenced) and the rows converted so far.
    at: usize,
    n: usize,
    buf: Vec<U>,
}

impl<U> Default for Gathered<U> {
    fn default() -> Self {
        Gathered {
            at: 0,
            n: 0,
            buf: Vec::new(),
        }
    }
}

impl<U: Copy + bytemuck::Zeroable> Gathered<U> {
    /// Drops the block held, keeping the buffer.
    pub(crate) fn forget(&mut self) {
        (self.at, self.n) = (0, 0);
    }

    pub(crate) fn rows<B>(
        &mut self,
        src: &[B],
        stride: usize,
        r: usize,
        nb: usize,
        per: usize,
        convert: impl Fn(&[B], &mut [U]),
    ) -> &[U] {
        let at = src.as_ptr() as usize;
        if at != self.at {
            (self.at, self.n) = (at, 0);
        }
        if self.buf.len() < r * per {
            self.buf.resize(r * per, U::zeroed());
        }
        for i in self.n..r {
            convert(&src[i * stride..][..nb], &mut self.buf[i * per..][..per]);
        }
        self.n = self.n.max(r);
        &self.buf[..r * per]
    }
}

/// `s ← scale·s`, returning the largest of the new values. Kept in 16 lanes, so that the loop is
/// vectorized (a single running `max` is a serial chain): a maximum does not depend on the order it is
/// taken in, so every caller gets the same value.
#[inline(always)]
fn scale_max(s: &mut [f32], scale: f32) -> f32 {
    const L: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; L];
    let mut chunks = s.chunks_exact_mut(L);
    for c in &mut chunks {
        for (m, x) in lanes.iter_mut().zip(c.iter_mut()) {
            *x *= scale;
            *m = m.max(*x);
        }
    }
    for (m, x) in lanes.iter_mut().zip(chunks.into_remainder()) {
        *x *= scale;
        *m = m.max(*x);
    }
    lanes.iter().fold(f32::NEG_INFINITY, |a, &m| a.max(m))
}

/// Calls `f(k_page, v_page, p0, b0, rows)` for every block of `BLOCK` positions (fewer at the end of a
/// page or of the context) among the first `n_all` positions whose first position is in `lo..hi`: the
/// block starts at row `b0` of the page that starts at position `p0`.
#[inline(always)]
fn for_each_block<T>(
    kv: &KvPages<'_, T>,
    n_all: usize,
    lo: usize,
    hi: usize,
    mut f: impl FnMut(&[T], &[T], usize, usize, usize),
) {
    let hi = hi.min(n_all);
    let first_page = lo / kv.page_rows;
    for (p, (kp, vp)) in kv.k.iter().zip(kv.v).enumerate().skip(first_page) {
        let p0 = p * kv.page_rows;
        if p0 >= hi {
            break;
        }
        let rows = kv.page_rows.min(n_all - p0);
        for b0 in (0..rows).step_by(BLOCK) {
            if (lo..hi).contains(&(p0 + b0)) {
                f(kp, vp, p0, b0, BLOCK.min(rows - b0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ops::{dot, softmax};

    struct Rng(u32);
    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (self.0 >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        }
    }

    /// Splits a contiguous `[n_ctx × stride]` buffer into pages of `page_rows` positions.
    fn paged<T: Copy>(x: &[T], stride: usize, page_rows: usize) -> Vec<Vec<T>> {
        x.chunks(page_rows * stride).map(|c| c.to_vec()).collect()
    }

    #[test]
    fn streaming_softmax_matches_two_pass() {
        let (hd, stride, off) = (64, 96, 16);
        let mut rng = Rng(99);
        for n_ctx in [1usize, 5, 128, 129, 300, CHUNK + 1, 2 * CHUNK + 300] {
            let q: Vec<f32> = (0..hd).map(|_| 4.0 * rng.f()).collect();
            let k: Vec<f32> = (0..n_ctx * stride).map(|_| rng.f()).collect();
            let v: Vec<f32> = (0..n_ctx * stride).map(|_| rng.f()).collect();
            let mut s: Vec<f32> = (0..n_ctx)
                .map(|t| dot(&q, &k[t * stride + off..][..hd]) * 0.125)
                .collect();
            softmax(&mut s);
            let mut want = vec![0f32; hd];
            for (t, p) in s.iter().enumerate() {
                for (o, v) in want.iter_mut().zip(&v[t * stride + off..][..hd]) {
                    *o += p * v;
                }
            }
            let (kc, vc) = ([k.clone()], [v.clone()]);
            let mut got = vec![0f32; hd];
            attend_ref(
                &q,
                KvPages::contiguous(&kc, &vc, n_ctx, stride, off),
                n_ctx,
                0.125,
                &mut got,
            );
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "n_ctx={n_ctx}: {g} vs {w}");
            }
            // The same cache cut into pages (page sizes that do and do not divide BLOCK) gives the
            // same result: pages only change where rows are read from, never the order of the sums,
            // as long as block boundaries coincide (they do when page_rows is a multiple of BLOCK).
            // Other page sizes stay within rounding.
            for page_rows in [BLOCK, 2 * BLOCK, 1, 7, 100] {
                let (kp, vp) = (paged(&k, stride, page_rows), paged(&v, stride, page_rows));
                let mut p = vec![0f32; hd];
                let kv = KvPages {
                    k: &kp,
                    v: &vp,
                    page_rows,
                    stride,
                    offset: off,
                };
                attend_ref(&q, kv, n_ctx, 0.125, &mut p);
                if page_rows.is_multiple_of(BLOCK) {
                    assert_eq!(p, got, "n_ctx={n_ctx} page_rows={page_rows}");
                } else {
                    for (a, b) in p.iter().zip(&got) {
                        assert!((a - b).abs() < 1e-6, "page_rows={page_rows}: {a} vs {b}");
                    }
                }
            }
        }
    }

    /// f16 storage: the same as f32 storage of the f16-rounded values.
    #[test]
    fn f16_equals_f32_of_rounded_values() {
        let (hd, stride, n_ctx) = (32, 32, 77);
        let mut rng = Rng(5);
        let q: Vec<f32> = (0..hd).map(|_| 4.0 * rng.f()).collect();
        let k: Vec<f32> = (0..n_ctx * stride).map(|_| rng.f()).collect();
        let v: Vec<f32> = (0..n_ctx * stride).map(|_| rng.f()).collect();
        let (mut kh, mut vh) = (Vec::new(), Vec::new());
        f16::extend_from_f32(&mut kh, &k);
        f16::extend_from_f32(&mut vh, &v);
        let kr: Vec<f32> = kh.iter().map(|x| x.to_f32()).collect();
        let vr: Vec<f32> = vh.iter().map(|x| x.to_f32()).collect();
        let (a, b) = ([kh], [vh]);
        let (c, d) = ([kr], [vr]);
        let mut o16 = vec![0f32; hd];
        let mut o32 = vec![0f32; hd];
        attend_ref(
            &q,
            KvPages::contiguous(&a, &b, n_ctx, stride, 0),
            n_ctx,
            0.25,
            &mut o16,
        );
        attend_ref(
            &q,
            KvPages::contiguous(&c, &d, n_ctx, stride, 0),
            n_ctx,
            0.25,
            &mut o32,
        );
        assert_eq!(o16, o32);
    }

    #[test]
    #[should_panic(expected = "too short")]
    fn short_page_is_refused() {
        let k = [vec![0f32; 10]];
        let mut out = [0f32; 8];
        attend_ref(
            &[0.0; 8],
            KvPages::contiguous(&k, &k, 2, 8, 0),
            2,
            1.0,
            &mut out,
        );
    }
}
