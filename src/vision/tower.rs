//! The Qwen3.5 vision tower's forward pass (transformers' `Qwen3_5VisionModel`): one image's
//! `pixel_values` `[N × patch_dim]` (N = gh·gw patches in merge-block order) to its merged embeddings
//! `[N/merge² × d_text]`, which replace the image's `<|image_pad|>` token embeddings.
//!
//! 1. patch embedding (the Conv3d is one linear map of each row) + the learned 48 × 48 position table,
//!    bilinearly resampled to the grid;
//! 2. blocks `x += proj(attn(LN1(x))); x += fc2(gelu_tanh(fc1(LN2(x))))`, attention full (non-causal)
//!    over the image with a 2-D (row, column) rotary embedding;
//! 3. merger: LayerNorm, each merge block's `merge²` consecutive rows concatenated, fc1, exact GELU, fc2.
//!
//! Weight products go through `kernels::panel_gemm` (each weight widened to f32 and packed once per image,
//! every patch row through register tiles), K-quant weights through `kernels::matmul`'s int8 GEMM;
//! attention is two packed f32 GEMMs per head and block of queries, the blocks spread over the threads.

use std::cell::Cell;
use std::sync::OnceLock;

use anyhow::{ensure, Result};
use rayon::prelude::*;

use super::mmproj::{VisionHParams, VisionWeights, LN_EPS, ROPE_THETA};
use crate::gguf::GgufFile;
use crate::kernels::bf16_gemm;
use crate::kernels::fpenv::FlushDenormals;
use crate::kernels::panel_gemm::{
    gemm_packed, matmul_weight, matmul_weight_bf16, pack_rows, pack_transposed, packed_len,
};
use crate::kernels::{kernels, matmul, ops, Weight};
use crate::quant::GgmlType;

/// The tower: hyperparameters and weights (views into the mmproj mapping).
pub struct VisionModel<'a> {
    pub hp: VisionHParams,
    pub w: VisionWeights<'a>,
    /// How the blocks and the merger multiply (the patch embedding stays in f32).
    pub arith: Arith,
    /// [`Arith::Auto`]'s choice, made at the first image (it reads every matrix).
    bf16_exact: OnceLock<bool>,
}

/// The arithmetic of the tower's matrix products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Arith {
    /// bf16 where the CPU multiplies bf16 pairs (AVX512-BF16) and every matrix of the file is a bf16
    /// value (F16 / BF16 files converted from the models' BF16 checkpoints are), else f32: the default.
    /// An F32 mmproj stays f32.
    #[default]
    Auto,
    /// f32 throughout (weights widened exactly, activations unrounded).
    F32,
    /// Activations, and weights that are not bf16 values, rounded to bf16; products and sums in f32
    /// (as transformers runs the models in bf16). f32 where the CPU has no AVX512-BF16.
    Bf16,
}

/// Buffers of one forward pass, grown to the largest image seen and reused.
#[derive(Default)]
pub struct VisionScratch {
    /// `[N × D]` the residual stream.
    x: Vec<f32>,
    /// `[N × D]` a normed copy of `x`, or a sublayer's output before it is added.
    h: Vec<f32>,
    /// `[N × 3D]` q, k, v of every patch.
    qkv: Vec<f32>,
    /// Per head, its keys then its values packed for `gemm_packed` ([`packed_kv_len`] floats).
    kv: Vec<f32>,
    /// `[N × D]` attention output (heads side by side).
    attn: Vec<f32>,
    /// `[N × F]` the MLP's hidden layer; `[N/merge² × merge²·D]` the merger's.
    ffn: Vec<f32>,
    /// `[N × hd/2]` cosines and sines of each patch's rotary angles.
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// bf16 arithmetic: a matrix product's input as bf16 pairs, and the packed keys and values.
    pairs: Vec<u32>,
    kv16: Vec<u32>,
}

impl VisionScratch {
    pub fn new() -> VisionScratch {
        VisionScratch::default()
    }
}

/// Intermediate values [`VisionModel::encode_with_taps`] shows its caller (for comparisons against a
/// reference).
#[derive(Clone, Copy, Debug)]
pub enum VisionTap<'s> {
    /// `[N × D]` the position embeddings resampled to the grid, in merge-block order.
    PositionEmbeddings(&'s [f32]),
    /// `[N × D]` the hidden states entering block `block` (patch + position embedding for 0; after
    /// the last block for `n_layer`).
    Hidden { block: usize, x: &'s [f32] },
}

/// Queries per attention work item (a multiple of every kernel's tile rows): their scores
/// `[QUERY_BLOCK × N]` stay in L2 (N = 3072: 576 KiB).
const QUERY_BLOCK: usize = 48;

/// Floats of one head's packed keys (`N` columns of depth `hd`) and values (`hd` columns of depth `N`).
fn packed_kv_len(n: usize, hd: usize) -> (usize, usize) {
    (packed_len(n, hd), packed_len(hd, n))
}

thread_local! {
    /// A worker's attention scores, kept from one call to the next.
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The same for [`VisionModel::attention_bf16`], with the queries' or the weights' bf16 pairs.
    static SCORES16: Cell<(Vec<f32>, Vec<u32>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

impl<'a> VisionModel<'a> {
    /// Reads and checks an mmproj file's metadata and tensors.
    pub fn load(f: &'a GgufFile) -> Result<VisionModel<'a>> {
        let hp = VisionHParams::from_gguf(f)?;
        let w = VisionWeights::load(f, &hp)?;
        Ok(VisionModel {
            hp,
            w,
            arith: Arith::default(),
            bf16_exact: OnceLock::new(),
        })
    }

    /// See [`VisionHParams::check_text_model`].
    pub fn check_text_model(&self, n_embd_text: usize) -> Result<()> {
        self.hp.check_text_model(n_embd_text)
    }

    /// Whether the blocks and the merger run in bf16 ([`Arith`]).
    pub fn uses_bf16(&self) -> bool {
        match self.arith {
            Arith::F32 => false,
            Arith::Bf16 => bf16_gemm::available(),
            Arith::Auto => {
                bf16_gemm::available() && *self.bf16_exact.get_or_init(|| self.matrices_are_bf16())
            }
        }
    }

    /// Every block and merger matrix is F16 or BF16 and each value is a bf16 value.
    fn matrices_are_bf16(&self) -> bool {
        let w = &self.w;
        let mats = w
            .blocks
            .iter()
            .flat_map(|b| [&b.qkv, &b.out, &b.fc1, &b.fc2])
            .chain([&w.mm0, &w.mm2]);
        mats.collect::<Vec<_>>().par_iter().all(|m| match m.ty {
            GgmlType::BF16 => true,
            // A normal f16 (or inf / NaN) is a bf16 value when its 3 lowest mantissa bits are 0; a
            // subnormal one when its f32 widening has 16 trailing zero bits.
            GgmlType::F16 => m.data.par_chunks(1 << 16).all(|c| {
                c.chunks_exact(2).all(|h| {
                    let b = u16::from_le_bytes([h[0], h[1]]);
                    if b & 0x7c00 != 0 {
                        b & 7 == 0
                    } else {
                        half::f16::from_bits(b).to_f32().to_bits() & 0xffff == 0
                    }
                })
            }),
            _ => false,
        })
    }

    /// Merged tokens an image of `grid_h × grid_w` patches becomes.
    pub fn n_merged(&self, grid_h: usize, grid_w: usize) -> usize {
        let m = self.hp.image.merge_size;
        (grid_h / m) * (grid_w / m)
    }

    /// One image's embeddings `[grid_h·grid_w/merge² × n_out]` (row r = merged token r, row-major over the
    /// merged grid) from its `pixel_values` `[grid_h·grid_w × patch_dim]` in merge-block order.
    pub fn encode(
        &self,
        pixel_values: &[f32],
        grid_h: usize,
        grid_w: usize,
        scratch: &mut VisionScratch,
    ) -> Result<Vec<f32>> {
        self.encode_with_taps(pixel_values, grid_h, grid_w, scratch, &mut |_| {})
    }

    /// [`Self::encode`], handing the intermediate values to `tap` as they are computed.
    pub fn encode_with_taps(
        &self,
        pixel_values: &[f32],
        grid_h: usize,
        grid_w: usize,
        s: &mut VisionScratch,
        tap: &mut dyn FnMut(VisionTap<'_>),
    ) -> Result<Vec<f32>> {
        let hp = &self.hp;
        let (m, pd) = (hp.image.merge_size, hp.image.patch_dim());
        ensure!(
            grid_h > 0 && grid_w > 0 && grid_h.is_multiple_of(m) && grid_w.is_multiple_of(m),
            "image grid {grid_h} × {grid_w} patches: both sides must be non-zero multiples of the \
             merge size {m}"
        );
        let n = grid_h
            .checked_mul(grid_w)
            .filter(|n| n.checked_mul(pd) == Some(pixel_values.len()));
        let Some(n) = n else {
            anyhow::bail!(
                "pixel_values has {} values; a {grid_h} × {grid_w} grid needs {grid_h}·{grid_w} rows of {pd}",
                pixel_values.len()
            );
        };
        ensure!(
            pixel_values.iter().all(|v| v.is_finite()),
            "pixel_values holds a NaN or infinity"
        );
        let (d, hd, ff) = (hp.n_embd, hp.head_dim, hp.n_ff);
        let w = &self.w;
        let bf16 = self.uses_bf16();
        for (v, len) in [
            (&mut s.x, n * d),
            (&mut s.h, n * d),
            (&mut s.qkv, n * 3 * d),
            // The f32 keys and values (bf16 attention packs its own, `kv16`).
            (&mut s.kv, {
                let (k, v) = packed_kv_len(n, hd);
                if bf16 {
                    0
                } else {
                    hp.n_head * (k + v)
                }
            }),
            (&mut s.attn, n * d),
            (&mut s.ffn, n * ff.max(d)),
            (&mut s.cos, n * hd / 2),
            (&mut s.sin, n * hd / 2),
        ] {
            v.resize(len, 0.0);
        }
        let (x, h) = (&mut s.x[..n * d], &mut s.h[..n * d]);

        // Patch embedding + position embedding: x = P·Wᵀ + b + pos   [N × D]
        linear(&w.patch_matrix(hp), &w.patch_b, pixel_values, n, x, None)?;
        self.position_embeddings(grid_h, grid_w, h);
        tap(VisionTap::PositionEmbeddings(&*h));
        add_rows(x, h);
        tap(VisionTap::Hidden { block: 0, x: &*x });

        self.rotary_tables(grid_h, grid_w, &mut s.cos, &mut s.sin);
        let qkv = &mut s.qkv[..n * 3 * d];
        let attn = &mut s.attn[..n * d];
        let fh = &mut s.ffn[..n * ff];
        let pairs = &mut s.pairs;
        let mut lin = |w: &Weight, b: &[f32], x: &[f32], n: usize, out: &mut [f32]| {
            linear(w, b, x, n, out, bf16.then_some(&mut *pairs))
        };
        for (il, b) in w.blocks.iter().enumerate() {
            // x += proj(attn(LN1(x)))
            layer_norm_rows(x, &b.ln1_w, &b.ln1_b, h);
            lin(&b.qkv, &b.qkv_b, h, n, qkv)?;
            self.rotate_qk(qkv, &s.cos, &s.sin);
            if bf16 {
                self.attention_bf16(qkv, n, &mut s.kv16, attn);
            } else {
                self.attention(qkv, n, &mut s.kv, attn);
            }
            lin(&b.out, &b.out_b, attn, n, h)?;
            add_rows(x, h);
            // x += fc2(gelu_tanh(fc1(LN2(x))))
            layer_norm_rows(x, &b.ln2_w, &b.ln2_b, h);
            lin(&b.fc1, &b.fc1_b, h, n, fh)?;
            fh.par_chunks_mut(ff).for_each(ops::gelu_tanh_in_place);
            lin(&b.fc2, &b.fc2_b, fh, n, h)?;
            add_rows(x, h);
            tap(VisionTap::Hidden {
                block: il + 1,
                x: &*x,
            });
        }

        // Merger: LN per patch, then each merge block's rows side by side (they are consecutive):
        // [N × D] = [N/m² × m²D] → fc1 → GELU (erf) → fc2   [N/m² × n_out]
        layer_norm_rows(x, &w.post_ln_w, &w.post_ln_b, h);
        let (nm, md) = (n / (m * m), hp.merged_dim());
        let merged = &mut s.ffn[..nm * md];
        lin(&w.mm0, &w.mm0_b, h, nm, merged)?;
        merged.par_chunks_mut(md).for_each(ops::gelu_erf_in_place);
        let mut out = vec![0f32; nm * hp.n_out];
        lin(&w.mm2, &w.mm2_b, merged, nm, &mut out)?;
        Ok(out)
    }

    /// The grid position of each patch in merge-block order: block row, block column, row and column
    /// inside the block.
    fn patch_positions(
        &self,
        grid_h: usize,
        grid_w: usize,
    ) -> impl Iterator<Item = (usize, usize)> {
        let m = self.hp.image.merge_size;
        let (bh, bw) = (grid_h / m, grid_w / m);
        (0..bh * bw).flat_map(move |blk| {
            let (br, bc) = (blk / bw, blk % bw);
            (0..m * m).map(move |i| (br * m + i / m, bc * m + i % m))
        })
    }

    /// `out [N × D]`: the position table resampled to `grid_h × grid_w` by bilinear interpolation with
    /// aligned corners (grid index `i` reads table coordinate `i·(side−1)/(g−1)`), weights and sums in f64.
    fn position_embeddings(&self, grid_h: usize, grid_w: usize, out: &mut [f32]) {
        let (d, side) = (self.hp.n_embd, self.hp.pos_side);
        let table = &self.w.pos_table;
        // Per grid index: the two table indices and the weight of the second.
        let axis = |g: usize| -> Vec<(usize, usize, f64)> {
            (0..g)
                .map(|i| {
                    let src = match g {
                        1 => 0.0,
                        _ => i as f64 * (side - 1) as f64 / (g - 1) as f64,
                    };
                    let lo = (src.floor() as usize).min(side - 1);
                    (lo, (lo + 1).min(side - 1), src - lo as f64)
                })
                .collect()
        };
        let (rows, cols) = (axis(grid_h), axis(grid_w));
        let positions: Vec<(usize, usize)> = self.patch_positions(grid_h, grid_w).collect();
        out.par_chunks_mut(d)
            .zip(positions.par_iter())
            .for_each(|(o, &(r, c))| {
                let ((r0, r1, dr), (c0, c1, dc)) = (rows[r], cols[c]);
                let taps = [
                    (r0 * side + c0, (1.0 - dr) * (1.0 - dc)),
                    (r0 * side + c1, (1.0 - dr) * dc),
                    (r1 * side + c0, dr * (1.0 - dc)),
                    (r1 * side + c1, dr * dc),
                ];
                for (k, o) in o.iter_mut().enumerate() {
                    *o = taps
                        .iter()
                        .map(|&(t, wt)| wt * table[t * d + k] as f64)
                        .sum::<f64>() as f32;
                }
            });
    }

    /// Per patch, the cosines and sines of its `hd/2` rotary angles `[row·f_j, col·f_j]`,
    /// `f_j = θ^(−2j/(hd/2))` for `j < hd/4`; pair `(k, k + hd/2)` of each head turns by angle `k`.
    fn rotary_tables(&self, grid_h: usize, grid_w: usize, cos: &mut [f32], sin: &mut [f32]) {
        let half = self.hp.head_dim / 2;
        let inv_freq: Vec<f64> = (0..half / 2)
            .map(|j| ROPE_THETA.powf(-2.0 * j as f64 / half as f64))
            .collect();
        for ((r, c), (cos, sin)) in self
            .patch_positions(grid_h, grid_w)
            .zip(cos.chunks_exact_mut(half).zip(sin.chunks_exact_mut(half)))
        {
            let angles = inv_freq.iter().map(|f| r as f64 * f);
            let angles = angles.chain(inv_freq.iter().map(|f| c as f64 * f));
            for ((a, cos), sin) in angles.zip(cos.iter_mut()).zip(sin.iter_mut()) {
                let (s, c) = a.sin_cos();
                (*cos, *sin) = (c as f32, s as f32);
            }
        }
    }

    /// Rotates every head's q and k in place (`qkv` rows are `[q | k | v]`).
    fn rotate_qk(&self, qkv: &mut [f32], cos: &[f32], sin: &[f32]) {
        let (d, hd) = (self.hp.n_embd, self.hp.head_dim);
        qkv.par_chunks_mut(3 * d)
            .zip(cos.par_chunks(hd / 2).zip(sin.par_chunks(hd / 2)))
            .for_each(|(row, (cos, sin))| {
                for head in row[..2 * d].chunks_exact_mut(hd) {
                    ops::rope(head, cos, sin);
                }
            });
    }

    /// `out [N × D]`: per head, `softmax(q·kᵀ/√hd)·v` over all `n` patches. Work items are blocks of
    /// queries (all heads), so each writes its own rows of `out`.
    fn attention(&self, qkv: &[f32], n: usize, kv: &mut [f32], out: &mut [f32]) {
        let (d, hd, nh) = (self.hp.n_embd, self.hp.head_dim, self.hp.n_head);
        let scale = 1.0 / (hd as f32).sqrt();
        let (kl, vl) = packed_kv_len(n, hd);
        // Per head, its keys (the scores' B: `N` columns of depth `hd`, times the scale) and values (the
        // output's B: `hd` columns of depth `N`) packed once for every query block.
        kv[..nh * (kl + vl)]
            .par_chunks_mut(kl + vl)
            .enumerate()
            .for_each(|(head, kv)| {
                let (kp, vp) = kv.split_at_mut(kl);
                pack_transposed(n, hd, &qkv[d + head * hd..], 3 * d, kp);
                kp.iter_mut().for_each(|k| *k *= scale);
                pack_rows(hd, n, &qkv[2 * d + head * hd..], 3 * d, vp);
            });
        let kv = &*kv;
        out.par_chunks_mut(QUERY_BLOCK * d)
            .enumerate()
            .for_each(|(blk, out)| {
                // Weights of far-off keys underflow into subnormals, which x86 handles in microcode.
                let _ftz = FlushDenormals::new();
                let (t0, rows) = (blk * QUERY_BLOCK, out.len() / d);
                let mut scores = SCORES.take();
                scores.resize(QUERY_BLOCK * n, 0.0);
                let sc = &mut scores[..rows * n];
                for head in 0..nh {
                    let q = &qkv[t0 * 3 * d + head * hd..];
                    let (kp, vp) = kv[head * (kl + vl)..][..kl + vl].split_at(kl);
                    // S = Q_h (scale · K_h)ᵀ   [rows × N]
                    gemm_packed(rows, n, hd, q, 3 * d, kp, sc, n, false);
                    sc.chunks_exact_mut(n).for_each(ops::softmax);
                    // O_h = S · V_h   [rows × hd] into this head's columns of `out`.
                    gemm_packed(rows, hd, n, sc, n, vp, &mut out[head * hd..], d, false);
                }
                SCORES.set(scores);
            });
    }

    /// [`Self::attention`] in bf16: queries, keys, the unnormalized softmax weights and values rounded to
    /// bf16, the scores and outputs summed in f32 (the scale applied to the scores, the outputs divided by
    /// the weights' sums).
    fn attention_bf16(&self, qkv: &[f32], n: usize, kv: &mut Vec<u32>, out: &mut [f32]) {
        let (d, hd, nh) = (self.hp.n_embd, self.hp.head_dim, self.hp.n_head);
        let scale = 1.0 / (hd as f32).sqrt();
        let (kl, vl) = (bf16_gemm::packed_len(n, hd), bf16_gemm::packed_len(hd, n));
        let (hd2, n2) = (bf16_gemm::pairs(hd), bf16_gemm::pairs(n));
        kv.resize(nh * (kl + vl), 0);
        kv.par_chunks_mut(kl + vl)
            .enumerate()
            .for_each(|(head, kv)| {
                let (kp, vp) = kv.split_at_mut(kl);
                bf16_gemm::pack_transposed(n, hd, &qkv[d + head * hd..], 3 * d, kp);
                bf16_gemm::pack_rows(hd, n, &qkv[2 * d + head * hd..], 3 * d, vp);
            });
        let kv = &*kv;
        out.par_chunks_mut(QUERY_BLOCK * d)
            .enumerate()
            .for_each(|(blk, out)| {
                let _ftz = FlushDenormals::new();
                let (t0, rows) = (blk * QUERY_BLOCK, out.len() / d);
                let (mut scores, mut pairs) = SCORES16.take();
                scores.resize(QUERY_BLOCK * n, 0.0);
                pairs.resize(QUERY_BLOCK * n2.max(hd2), 0);
                let sc = &mut scores[..rows * n];
                let mut sums = [0f32; QUERY_BLOCK];
                for head in 0..nh {
                    let (kp, vp) = kv[head * (kl + vl)..][..kl + vl].split_at(kl);
                    // S = scale · Q_h K_hᵀ   [rows × N]
                    let q = &qkv[t0 * 3 * d + head * hd..];
                    bf16_gemm::rows_to_pairs(rows, hd, q, 3 * d, &mut pairs);
                    bf16_gemm::gemm(rows, n, hd2, &pairs, hd2, kp, sc, n, false);
                    // E = exp(scale·(S − max)) per row, as bf16 pairs, and its row sums.
                    for (r, row) in sc.chunks_exact(n).enumerate() {
                        sums[r] = bf16_gemm::softmax_pairs(row, scale, &mut pairs[r * n2..]);
                    }
                    // O_h = E · V_h / sums   [rows × hd] into this head's columns of `out`.
                    let o = &mut out[head * hd..];
                    bf16_gemm::gemm(rows, hd, n2, &pairs, n2, vp, o, d, false);
                    for (r, &sum) in sums[..rows].iter().enumerate() {
                        o[r * d..][..hd].iter_mut().for_each(|v| *v /= sum);
                    }
                }
                SCORES16.set((scores, pairs));
            });
    }
}

/// `out = x·Wᵀ + b` for `n` rows: K-quant weights through the table's int8 prefill GEMM, the rest
/// widened to f32 ([`matmul_weight`]), or with `pairs` (a buffer for `x` as bf16 pairs) in bf16
/// ([`matmul_weight_bf16`]).
fn linear(
    w: &Weight,
    b: &[f32],
    x: &[f32],
    n: usize,
    out: &mut [f32],
    pairs: Option<&mut Vec<u32>>,
) -> Result<()> {
    if kernels().quant_gemm.is_some_and(|g| (g.supports)(w.ty)) {
        matmul(w, x, n, out);
    } else if let Some(pairs) = pairs {
        let k2 = bf16_gemm::pairs(w.n_in);
        pairs.resize(n * k2, 0);
        bf16_gemm::to_pairs(n, w.n_in, x, w.n_in, pairs);
        matmul_weight_bf16(w, &pairs[..n * k2], n, out)?;
    } else {
        matmul_weight(w, x, n, out)?;
    }
    out.par_chunks_mut(b.len())
        .for_each(|row| ops::add_bias(row, b));
    Ok(())
}

/// `out = LN(x)` row by row.
fn layer_norm_rows(x: &[f32], w: &[f32], b: &[f32], out: &mut [f32]) {
    let d = w.len();
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, x)| {
            o.copy_from_slice(x);
            ops::layer_norm(o, w, b, LN_EPS);
        });
}

/// `x += y` element-wise.
fn add_rows(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(y.par_chunks(4096))
        .for_each(|(x, y)| x.iter_mut().zip(y).for_each(|(x, y)| *x += y));
}
