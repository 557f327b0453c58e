//! Attention over a KV cache of Q8_0 or Q4_0 blocks (llama.cpp's `-ctk q8_0` / `-ctv q4_0`), read in
//! place as ggml's CPU flash attention reads it: the query is quantized to Q8_0 once per call, and the
//! key rows of a block are dotted with a group of up to eight queries by the kernel table's `quant_rows`
//! (the SIMD dot products of the weight matrices, held to the scalar reference by their own tests). A
//! block's value rows are dequantized once, for all the groups that read them, into a block-sized
//! buffer; the softmax weights and the weighted sums of values are the table's f32 steps. No widened
//! copy of the cache is made. The streaming softmax is [`attend`](super::attend)'s grouped body.

use std::cell::Cell;

use bytemuck::Zeroable;

use super::attend::{body_grouped, AttnOut, Gathered, KvPages, KvStore, BLOCK, GROUP};
use super::dispatch::Kernels;
use crate::quant::{BlockFormat, BlockQ4_0, BlockQ8_0, GgmlType};

/// A block format a KV cache can be stored in: dotted with a Q8_0 query.
pub trait KvBlock: KvStore + BlockFormat<VecDot = BlockQ8_0> {}

impl KvBlock for BlockQ8_0 {}
impl KvBlock for BlockQ4_0 {}

impl KvStore for BlockQ8_0 {
    const PER: usize = 32;
    fn extend_from_f32(dst: &mut Vec<Self>, src: &[f32]) {
        extend_blocks(dst, src)
    }
}

impl KvStore for BlockQ4_0 {
    const PER: usize = 32;
    fn extend_from_f32(dst: &mut Vec<Self>, src: &[f32]) {
        extend_blocks(dst, src)
    }
}

/// Appends `src` quantized (ggml's reference quantizer) to `dst`.
fn extend_blocks<B: BlockFormat>(dst: &mut Vec<B>, src: &[f32]) {
    assert!(
        src.len().is_multiple_of(B::BLOCK),
        "KV rows are not whole blocks"
    );
    let at = dst.len();
    dst.resize(at + src.len() / B::BLOCK, B::zeroed());
    B::quantize(src, &mut dst[at..]);
}

/// The buffers of one [`attend_quant_many_with`] call, kept per thread so that decoding (a call per
/// layer and KV head) neither allocates nor zero-fills them: the quantized queries, a block's gathered
/// key rows (as bytes, whatever the block type) and its dequantized value rows.
#[derive(Default)]
struct Scratch {
    queries: Vec<BlockQ8_0>,
    keys: Gathered<u8>,
    vals: Gathered<f32>,
}

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// `out = Σ_τ softmax_τ(scale · q·k_τ) v_τ` over `τ < n_ctx` for a cache of blocks `B` (`kv`'s stride
/// and offset in blocks; `q.len()` a multiple of 32), through the kernel table chosen for this CPU.
pub fn attend_quant<B: KvBlock>(
    q: &[f32],
    kv: KvPages<'_, B>,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    let _ftz = super::fpenv::FlushDenormals::new();
    attend_quant_with(super::kernels(), q, kv, n_ctx, scale, out)
}

/// [`attend_quant`] with the dot products and the query's quantization of table `k` (the scalar
/// table's is the reference of every other).
pub fn attend_quant_with<B: KvBlock>(
    k: &Kernels,
    q: &[f32],
    kv: KvPages<'_, B>,
    n_ctx: usize,
    scale: f32,
    out: &mut [f32],
) {
    attend_quant_many_with(k, q, &[n_ctx], kv, scale, AttnOut::Whole(out))
}

/// [`attend_quant`] for several queries over the same KV head, as
/// [`attend_many`](super::attend::attend_many): each block of the cache is read once for all of them.
pub fn attend_quant_many<B: KvBlock>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, B>,
    scale: f32,
    out: &mut [f32],
) {
    attend_quant_many_into(qs, n_ctx, kv, scale, AttnOut::Whole(out))
}

/// [`attend_quant_many`] into any [`AttnOut`], as [`attend_many_into`](super::attend::attend_many_into).
pub fn attend_quant_many_into<B: KvBlock>(
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, B>,
    scale: f32,
    out: AttnOut<'_>,
) {
    let _ftz = super::fpenv::FlushDenormals::new();
    attend_quant_many_with(super::kernels(), qs, n_ctx, kv, scale, out)
}

/// [`attend_quant_many`] through table `k`; query `i` alone gives the same bits as
/// [`attend_quant_with`].
pub fn attend_quant_many_with<B: KvBlock>(
    k: &Kernels,
    qs: &[f32],
    n_ctx: &[usize],
    kv: KvPages<'_, B>,
    scale: f32,
    out: AttnOut<'_>,
) {
    let nq = n_ctx.len();
    assert!(
        nq > 0 && qs.len().is_multiple_of(nq),
        "attend_quant: {nq} queries of {} values",
        qs.len()
    );
    let hd = qs.len() / nq;
    assert!(
        hd.is_multiple_of(B::BLOCK),
        "attend_quant: head of {hd} elements"
    );
    super::attend::check_out(&out, nq, qs.len());
    let nb = hd / B::BLOCK;
    kv.check(nb, n_ctx.iter().copied().max().unwrap_or(0));
    let mut scratch = SCRATCH.take();
    let Scratch {
        queries: qq,
        keys,
        vals,
    } = &mut scratch;
    // A block is known by its address, which a later call may see again with other rows in it (a
    // cache cut back and refilled): nothing gathered in an earlier call is reused.
    keys.forget();
    vals.forget();
    // Every query quantized to Q8_0 once.
    if qq.len() < nb * nq {
        qq.resize(nb * nq, BlockQ8_0::zeroed());
    }
    for (q, qq) in qs.chunks_exact(hd).zip(qq.chunks_exact_mut(nb)) {
        (k.quantize_act)(GgmlType::Q8_0, q, bytemuck::cast_slice_mut(qq));
    }
    // A block's key rows gathered back to back (a page interleaves the KV heads), so that one
    // `quant_rows` call dots them with a whole group of queries; and its value rows dequantized. Both
    // are made once per block, on its first group, and serve every group after it.
    let row_bytes = nb * core::mem::size_of::<B>();
    let mut dots = [0f32; BLOCK * GROUP];
    body_grouped(
        qs,
        n_ctx,
        kv,
        scale,
        out,
        GROUP,
        |i0, group, key: &[B], _, stride, s, r| {
            let g = group.len() / hd;
            let rows = keys.rows(key, stride, r, nb, row_bytes, |row, dst| {
                dst.copy_from_slice(bytemuck::cast_slice(row))
            });
            let qi: &[u8] = bytemuck::cast_slice(&qq[i0 * nb..(i0 + g) * nb]);
            let d = &mut dots[..r * g];
            // `quant_rows` gives every (row, query) the bits of a one-row, one-query call.
            (k.quant_rows)(B::TYPE, rows, qi, g, d);
            for (j, s) in s.iter_mut().enumerate() {
                for (t, s) in s[..r].iter_mut().enumerate() {
                    *s = d[t * g + j];
                }
            }
        },
        k.attend_steps.weights,
        |outs, w, v: &[B], stride, r| {
            let rows = vals.rows(v, stride, r, nb, hd, |row, dst| B::dequantize(row, dst));
            (k.attend_steps.values)(outs, w, rows, hd, r)
        },
    );
    SCRATCH.set(scratch);
}
