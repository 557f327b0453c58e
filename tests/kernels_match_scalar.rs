//! Every kernel table this CPU runs (`deltaq::kernels::available()`: scalar, AVX2, AVX-512, NEON, ...)
//! against the scalar reference: quantized and float row products on random and edge-case blocks for
//! every weight type, odd row counts and several token counts, activation quantizers byte for byte, the
//! element-wise ops (within 1e-6 relative; the vector `exp` within 2 ulp of `f32::exp`),
//! `DELTAQ_ISA` forcing a table, and whole-model logits with every table.
//!
//! Tables other than scalar are generic over the instruction set, so the same file tests NEON when the
//! tests run on (or under emulation of) an aarch64 CPU.

use std::path::PathBuf;
use std::process::Command;

use deltaq::kernels::attend::{
    attend_ref, merge_chunks, AttnOut, ChunkStat, KvElem, KvPages, KvStore, CHUNK,
};
use deltaq::kernels::attend_quant::{attend_quant_with, KvBlock};
use deltaq::kernels::{self, Isa, Kernels};
use deltaq::model::KV_PAGE;
use deltaq::quant::{self, BlockQ4_0, BlockQ8_0, GgmlType};
use half::f16;

const QUANT_TYPES: [GgmlType; GgmlType::WEIGHT_QUANTS.len()] = GgmlType::WEIGHT_QUANTS;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn tables() -> Vec<&'static Kernels> {
    let all = kernels::available();
    assert_eq!(all[0].isa, Isa::Scalar, "scalar comes first");
    all
}

fn scalar() -> &'static Kernels {
    tables()[0]
}

/// Offsets of the f16 scale fields in a weight block.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::IQ3_XXS | GgmlType::IQ3_S => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::TQ1_0 => &[52],
        GgmlType::TQ2_0 => &[64],
        // MXFP4's scale is an E8M0 byte (see `weight_rows`).
        GgmlType::MXFP4 => &[],
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ1_S => &[0],
        // IQ1_M's f16 scale is spread over nibbles: set by `weight_rows` itself.
        GgmlType::IQ1_M => &[],
        _ => unreachable!(),
    }
}

/// The byte range of a weight block that holds codes (not scales).
fn code_bytes(ty: GgmlType) -> std::ops::Range<usize> {
    match ty {
        GgmlType::Q4_0 => 2..18,
        GgmlType::Q4_1 => 4..20,
        GgmlType::Q5_0 => 2..22,
        GgmlType::Q5_1 => 4..24,
        GgmlType::Q8_0 => 2..34,
        GgmlType::Q2_K => 16..80,
        GgmlType::Q3_K => 0..96,
        GgmlType::Q4_K => 16..144,
        GgmlType::Q5_K => 16..176,
        GgmlType::Q6_K => 0..192,
        GgmlType::IQ3_XXS => 2..98,
        // qs, qh and signs (the four scale bytes follow).
        GgmlType::IQ3_S => 2..106,
        GgmlType::IQ4_NL => 2..18,
        GgmlType::IQ4_XS => 8..136,
        GgmlType::TQ1_0 => 0..52,
        GgmlType::TQ2_0 => 0..64,
        GgmlType::MXFP4 => 1..17,
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS => 2..66,
        GgmlType::IQ2_S => 2..74,
        GgmlType::IQ1_S => 2..34,
        GgmlType::IQ1_M => 0..48,
        _ => unreachable!(),
    }
}

/// How a weight block is filled.
#[derive(Clone, Copy, Debug)]
enum Fill {
    Random,
    Zero,
    /// Every code and scale byte 0xFF (largest codes and scales; Q8_0: all −1), scales at `d`.
    Ones,
    /// Every code and scale byte 0x80 (Q8_0: −128).
    High,
}

fn weight_rows(ty: GgmlType, rows: usize, n: usize, fill: Fill, rng: &mut Rng) -> Vec<u8> {
    let bs = ty.type_size();
    let nb = rows * n / ty.block_size();
    let mut w = vec![0u8; nb * bs];
    for blk in w.chunks_exact_mut(bs) {
        match fill {
            Fill::Zero => continue,
            Fill::Random => blk.iter_mut().for_each(|b| *b = rng.byte()),
            Fill::Ones => blk.fill(0xFF),
            Fill::High => blk.fill(0x80),
        }
        for &o in f16_fields(ty) {
            // Scales of either sign over several orders of magnitude, sometimes zero.
            let v = match rng.byte() % 8 {
                0 => 0.0,
                1 => 60000.0 * rng.f(),
                _ => rng.f() * 10f32.powi((rng.byte() % 5) as i32 - 3),
            };
            blk[o..o + 2].copy_from_slice(&quant::f16_from_f32(v).to_le_bytes());
        }
        if ty == GgmlType::MXFP4 {
            // E8M0 scales 2^-24 .. 2^7, clear of the f32 overflow of the largest bytes.
            blk[0] = 104 + rng.byte() % 32;
        }
        if ty == GgmlType::IQ1_M {
            // The f16 super-scale's nibble k is the top nibble of the u16 scale word k.
            let h = quant::f16_from_f32(rng.f() * 10f32.powi((rng.byte() % 5) as i32 - 3));
            for k in 0..4 {
                let b = &mut blk[48 + 2 * k + 1];
                *b = (*b & 0x0F) | (((h >> (4 * k)) & 0xF) << 4) as u8;
            }
        }
    }
    w
}

/// `n_tok` activation rows of `n` floats: random, with some all-zero, spiky and huge rows.
fn activations(n_tok: usize, n: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x = Vec::with_capacity(n_tok * n);
    for t in 0..n_tok {
        let kind = (t + rng.byte() as usize) % 5;
        for i in 0..n {
            x.push(match kind {
                0 => 0.0,
                1 if i % 37 == 0 => 1e4 * rng.f(),
                4 => 1e3 * rng.f(),
                _ => rng.f(),
            });
        }
    }
    x
}

fn quantize_acts(ty: GgmlType, x: &[f32], n: usize) -> Vec<u8> {
    let act = ty.vec_dot_type();
    let rb = act.row_bytes(n as u64).unwrap() as usize;
    let mut q = vec![0u8; x.len() / n * rb];
    for (x, q) in x.chunks_exact(n).zip(q.chunks_exact_mut(rb)) {
        (scalar().quantize_act)(act, x, q);
    }
    q
}

/// Σ |a|·(|w| + |w with codes zeroed|) per (row, token): the scale of the terms a kernel adds, offsets
/// and mins included, for the tolerance.
fn magnitudes(ty: GgmlType, w: &[u8], qa: &[u8], n: usize, rows: usize, n_tok: usize) -> Vec<f64> {
    let act = ty.vec_dot_type();
    let mut a = vec![0f32; n_tok * n];
    quant::dequantize_row(act, qa, &mut a).unwrap();
    let mut zeroed = w.to_vec();
    let codes = code_bytes(ty);
    for blk in zeroed.chunks_exact_mut(ty.type_size()) {
        blk[codes.clone()].fill(0);
    }
    let (mut wd, mut zd) = (vec![0f32; rows * n], vec![0f32; rows * n]);
    quant::dequantize_row(ty, w, &mut wd).unwrap();
    quant::dequantize_row(ty, &zeroed, &mut zd).unwrap();
    let mut out = vec![0f64; rows * n_tok];
    for r in 0..rows {
        for t in 0..n_tok {
            out[r * n_tok + t] = (0..n)
                .map(|i| {
                    let (w, z) = (wd[r * n + i] as f64, zd[r * n + i] as f64);
                    (w.abs() + z.abs()) * (a[t * n + i] as f64).abs()
                })
                .sum();
        }
    }
    out
}

fn check_quant(
    k: &Kernels,
    ty: GgmlType,
    rows: usize,
    n: usize,
    n_tok: usize,
    fill: Fill,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let w = weight_rows(ty, rows, n, fill, &mut rng);
    let x = activations(n_tok, n, &mut rng);
    let qa = quantize_acts(ty, &x, n);
    let mut want = vec![0f32; rows * n_tok];
    let mut got = vec![f32::NAN; rows * n_tok];
    (scalar().quant_rows)(ty, &w, &qa, n_tok, &mut want);
    (k.quant_rows)(ty, &w, &qa, n_tok, &mut got);
    let mag = magnitudes(ty, &w, &qa, n, rows, n_tok);
    for i in 0..rows * n_tok {
        let tol = 1e-5 * mag[i] + 1e-30;
        assert!(
            (got[i] as f64 - want[i] as f64).abs() <= tol,
            "{} {ty} {fill:?} rows={rows} n={n} n_tok={n_tok} row {} tok {}: {} vs scalar {} (tol {tol:e})",
            k.isa.name(),
            i / n_tok,
            i % n_tok,
            got[i],
            want[i]
        );
    }
}

#[test]
fn quant_rows_match_scalar() {
    for k in tables().into_iter().skip(1) {
        for (ti, ty) in QUANT_TYPES.into_iter().enumerate() {
            let bs = ty.block_size();
            for blocks in [1, 3, 16] {
                for rows in [1, 3, 5, 17] {
                    for n_tok in 1..=5 {
                        let seed = (ti * 1000 + blocks * 100 + rows * 10 + n_tok) as u64 + 1;
                        check_quant(k, ty, rows, blocks * bs, n_tok, Fill::Random, seed);
                    }
                }
            }
            for fill in [Fill::Zero, Fill::Ones, Fill::High] {
                for (rows, n_tok) in [(1, 1), (4, 1), (5, 3), (8, 8)] {
                    check_quant(k, ty, rows, 2 * bs, n_tok, fill, 7 + rows as u64);
                }
            }
        }
    }
}

/// TQ1_0, TQ2_0 and MXFP4 have no SIMD kernel: every table runs the scalar reference for them (an
/// explicit fallback in each table's `quant_rows`), so the results are the scalar ones bit for bit.
#[test]
fn types_without_simd_kernels_run_the_scalar_reference() {
    for k in tables() {
        for ty in [GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::MXFP4] {
            let (rows, n, n_tok) = (9, 2 * ty.block_size(), 5);
            let mut rng = Rng(17 + ty.id() as u64);
            let w = weight_rows(ty, rows, n, Fill::Random, &mut rng);
            let x = activations(n_tok, n, &mut rng);
            let qa = quantize_acts(ty, &x, n);
            let mut want = vec![0f32; rows * n_tok];
            let mut got = vec![f32::NAN; rows * n_tok];
            (scalar().quant_rows)(ty, &w, &qa, n_tok, &mut want);
            (k.quant_rows)(ty, &w, &qa, n_tok, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{} {ty}", k.isa.name());
        }
    }
}

/// `matmul` (the best table, rows split over rayon tasks) with 1 to 4 threads, odd row counts, one token
/// (decode) and several (prefill, token-major output), against the scalar row products.
#[test]
fn threaded_matmul_matches_scalar() {
    use deltaq::kernels::{matmul, Weight};
    let mut rng = Rng(99);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q5_1,
    ] {
        let (rows, n) = (301, 4 * ty.block_size().max(64));
        let w = weight_rows(ty, rows, n, Fill::Random, &mut rng);
        let weight = Weight {
            name: "w",
            ty,
            n_in: n,
            n_out: rows,
            data: &w,
        };
        for n_tok in [1, 7, 70] {
            let x = activations(n_tok, n, &mut rng);
            let qa = quantize_acts(ty, &x, n);
            let mut want = vec![0f32; rows * n_tok]; // [rows × n_tok]
            (scalar().quant_rows)(ty, &w, &qa, n_tok, &mut want);
            let mag = magnitudes(ty, &w, &qa, n, rows, n_tok);
            for threads in 1..=4 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut got = vec![f32::NAN; n_tok * rows]; // [n_tok × rows]
                pool.install(|| matmul(&weight, &x, n_tok, &mut got));
                for r in 0..rows {
                    for t in 0..n_tok {
                        let (g, e) = (got[t * rows + r] as f64, want[r * n_tok + t] as f64);
                        let tol = 1e-5 * mag[r * n_tok + t] + 1e-30;
                        assert!(
                            (g - e).abs() <= tol,
                            "{ty} threads={threads} n_tok={n_tok} row {r} tok {t}: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }
}

/// Q8_0 weights of −128 against activations of ±127 (the extremes of the sign trick), exactly.
#[test]
fn q8_0_extremes_exact() {
    let n = 64;
    let mut w = [0u8; 2 * 34];
    for (b, blk) in w.chunks_exact_mut(34).enumerate() {
        blk[..2].copy_from_slice(&quant::f16_from_f32(1.0).to_le_bytes());
        for (i, q) in blk[2..].iter_mut().enumerate() {
            *q = if (i + b) % 3 == 0 { 0x80 } else { 0x7F };
        }
    }
    let x: Vec<f32> = (0..2 * n)
        .map(|i| if i % 2 == 0 { 127.0 } else { -127.0 })
        .collect();
    let qa = quantize_acts(GgmlType::Q8_0, &x, n);
    let mut want = vec![0f32; 2];
    (scalar().quant_rows)(GgmlType::Q8_0, &w[..68], &qa, 2, &mut want);
    for k in tables() {
        let mut got = vec![0f32; 2];
        (k.quant_rows)(GgmlType::Q8_0, &w[..68], &qa, 2, &mut got);
        assert_eq!(got, want, "{}", k.isa.name());
    }
}

#[test]
fn float_rows_match_scalar() {
    for k in tables().into_iter().skip(1) {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for n in [1, 7, 8, 19, 64, 250, 1024] {
                for rows in [1, 3, 5, 17] {
                    for n_tok in 1..=5 {
                        let mut rng = Rng((n * 100 + rows * 10 + n_tok) as u64);
                        let wf: Vec<f32> = (0..rows * n).map(|_| rng.f() * 3.0).collect();
                        let w: Vec<u8> = match ty {
                            GgmlType::F32 => wf.iter().flat_map(|v| v.to_le_bytes()).collect(),
                            GgmlType::F16 => wf
                                .iter()
                                .flat_map(|v| quant::f16_from_f32(*v).to_le_bytes())
                                .collect(),
                            _ => wf
                                .iter()
                                .flat_map(|v| quant::bf16_from_f32(*v).to_le_bytes())
                                .collect(),
                        };
                        let a = activations(n_tok, n, &mut rng);
                        let mut want = vec![0f32; rows * n_tok];
                        let mut got = vec![f32::NAN; rows * n_tok];
                        (scalar().float_rows)(ty, &w, &a, n_tok, &mut want);
                        (k.float_rows)(ty, &w, &a, n_tok, &mut got);
                        for r in 0..rows {
                            for t in 0..n_tok {
                                let mag: f64 = (0..n)
                                    .map(|i| (wf[r * n + i] as f64 * a[t * n + i] as f64).abs())
                                    .sum();
                                let (g, w) = (got[r * n_tok + t], want[r * n_tok + t]);
                                assert!(
                                    (g as f64 - w as f64).abs() <= 1e-5 * mag + 1e-30,
                                    "{} {ty} n={n} rows={rows} n_tok={n_tok} r={r} t={t}: {g} vs {w}",
                                    k.isa.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `x` stored as a KV cache of `S` in pages of `n` values (the last one shorter).
fn pages<S: KvStore>(x: &[f32], n: usize) -> Vec<Vec<S>> {
    x.chunks(n)
        .map(|c| {
            let mut v = Vec::new();
            S::extend_from_f32(&mut v, c);
            v
        })
        .collect()
}

/// One query's attention over a random cache of `n_ctx` positions with `nkv` KV heads of `hd` elements,
/// stored as `T` in pages of `page_rows` positions; returns (every table's output for every head,
/// the scalar reference's).
fn attend_case<T: KvElem>(
    k: &Kernels,
    hd: usize,
    nkv: usize,
    n_ctx: usize,
    page_rows: usize,
    rng: &mut Rng,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let stride = nkv * hd;
    let kf: Vec<f32> = (0..n_ctx * stride).map(|_| rng.f()).collect();
    let vf: Vec<f32> = (0..n_ctx * stride).map(|_| rng.f()).collect();
    let (kp, vp) = (
        pages::<T>(&kf, page_rows * stride),
        pages::<T>(&vf, page_rows * stride),
    );
    let scale = 1.0 / (hd as f32).sqrt();
    (0..nkv)
        .map(|m| {
            // Sharp enough that the running maximum moves between blocks.
            let q: Vec<f32> = (0..hd).map(|_| 6.0 * rng.f()).collect();
            let kv = KvPages {
                k: &kp,
                v: &vp,
                page_rows,
                stride,
                offset: m * hd,
            };
            let mut want = vec![0f32; hd];
            let mut got = vec![f32::NAN; hd];
            attend_ref(&q, kv, n_ctx, scale, &mut want);
            T::attend_entry(k)(&q, kv, n_ctx, scale, &mut got);
            (got, want)
        })
        .collect()
}

/// Attention over f32 and f16 caches: every table against the scalar reference within 1e-5 of the
/// output's scale, for context 1, odd contexts, contexts across score blocks (128) and pages, several
/// head sizes (256 as in the models; 12 is not a multiple of 8 and takes the reference path) and GQA
/// strides (the head at an offset inside a row of several KV heads).
#[test]
fn attend_matches_scalar() {
    for k in tables().into_iter().skip(1) {
        for (hd, nkv) in [(256, 2), (64, 1), (8, 3), (12, 2)] {
            for n_ctx in [1, 2, 7, 127, 128, 129, 255, 300, 1031] {
                for page_rows in [KV_PAGE, n_ctx, 100] {
                    let mut rng = Rng((hd * 7919 + n_ctx * 31 + page_rows) as u64);
                    let f32s = attend_case::<f32>(k, hd, nkv, n_ctx, page_rows, &mut rng);
                    let f16s = attend_case::<f16>(k, hd, nkv, n_ctx, page_rows, &mut rng);
                    for (ty, res) in [("f32", f32s), ("f16", f16s)] {
                        for (m, (got, want)) in res.iter().enumerate() {
                            let norm = want.iter().fold(0f32, |a, w| a.max(w.abs()));
                            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                                assert!(
                                    (g - w).abs() <= 1e-5 * norm,
                                    "{} {ty} hd={hd} nkv={nkv} head {m} n_ctx={n_ctx} \
                                     page_rows={page_rows} [{i}]: {g} vs {w}",
                                    k.isa.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One query's attention over a random cache of blocks `B` (Q8_0 or Q4_0), `nkv` KV heads of `hd`
/// values in pages of `page_rows` positions, through table `k` and the scalar table: (got, want) per
/// head. Also holds the scalar result to the f32 reference attention over the dequantized cache with
/// the dequantized Q8_0 query (the same sums in f32, so within rounding).
fn attend_quant_case<B: KvBlock>(
    k: &Kernels,
    hd: usize,
    nkv: usize,
    n_ctx: usize,
    page_rows: usize,
    rng: &mut Rng,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let stride = nkv * hd;
    let kf: Vec<f32> = (0..n_ctx * stride).map(|_| rng.f()).collect();
    let vf: Vec<f32> = (0..n_ctx * stride).map(|_| rng.f()).collect();
    let (kp, vp) = (
        pages::<B>(&kf, page_rows * stride),
        pages::<B>(&vf, page_rows * stride),
    );
    let dequant = |pages: &[Vec<B>]| -> Vec<Vec<f32>> {
        pages
            .iter()
            .map(|p| {
                let mut out = vec![0f32; p.len() * 32];
                B::dequantize(p, &mut out);
                out
            })
            .collect()
    };
    let (kd, vd) = (dequant(&kp), dequant(&vp));
    let scale = 1.0 / (hd as f32).sqrt();
    let nb = hd / 32;
    (0..nkv)
        .map(|m| {
            let q: Vec<f32> = (0..hd).map(|_| 6.0 * rng.f()).collect();
            let kv = KvPages {
                k: &kp,
                v: &vp,
                page_rows,
                stride: stride / 32,
                offset: m * nb,
            };
            let mut want = vec![0f32; hd];
            let mut got = vec![f32::NAN; hd];
            attend_quant_with(scalar(), &q, kv, n_ctx, scale, &mut want);
            attend_quant_with(k, &q, kv, n_ctx, scale, &mut got);
            // The reference math: f32 attention over the dequantized cache and query.
            let mut qq = vec![0u8; hd / 32 * 34];
            quant::quantize_row(GgmlType::Q8_0, &q, &mut qq).unwrap();
            let mut qd = vec![0f32; hd];
            quant::dequantize_row(GgmlType::Q8_0, &qq, &mut qd).unwrap();
            let mut exact = vec![0f32; hd];
            let kvf = KvPages {
                k: &kd,
                v: &vd,
                page_rows,
                stride,
                offset: m * hd,
            };
            attend_ref(&qd, kvf, n_ctx, scale, &mut exact);
            let norm = exact.iter().fold(0f32, |a, w| a.max(w.abs()));
            for (w, e) in want.iter().zip(&exact) {
                assert!((w - e).abs() <= 1e-5 * norm, "scalar {w} vs f32 math {e}");
            }
            (got, want)
        })
        .collect()
}

/// Attention over Q8_0 and Q4_0 caches: every table (its `quant_rows` and Q8_0 quantizer) against
/// the scalar table within 1e-5 of the output's scale, for the shapes of `attend_matches_scalar`
/// whose heads are whole blocks.
#[test]
fn attend_quant_matches_scalar() {
    for k in tables() {
        for (hd, nkv) in [(256, 2), (64, 1), (32, 3)] {
            for n_ctx in [1, 2, 7, 128, 129, 300, 1031] {
                for page_rows in [KV_PAGE, n_ctx, 100] {
                    let mut rng = Rng((hd * 7919 + n_ctx * 31 + page_rows) as u64);
                    let q8 = attend_quant_case::<BlockQ8_0>(k, hd, nkv, n_ctx, page_rows, &mut rng);
                    let q4 = attend_quant_case::<BlockQ4_0>(k, hd, nkv, n_ctx, page_rows, &mut rng);
                    for (ty, res) in [("q8_0", q8), ("q4_0", q4)] {
                        for (m, (got, want)) in res.iter().enumerate() {
                            let norm = want.iter().fold(0f32, |a, w| a.max(w.abs()));
                            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                                assert!(
                                    (g - w).abs() <= 1e-5 * norm,
                                    "{} {ty} hd={hd} nkv={nkv} head {m} n_ctx={n_ctx} \
                                     page_rows={page_rows} [{i}]: {g} vs {w}",
                                    k.isa.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The element-wise ops' inputs: every length 1..=70 (vector bodies and every tail), uniform values at
/// several magnitudes, zeros, values where `exp` under- and overflows, infinities and NaN.
fn op_inputs() -> Vec<Vec<f32>> {
    let mut rng = Rng(0x0b5);
    let mut v = Vec::new();
    for n in 1..=70 {
        for mag in [1.0f32, 10.0, 100.0] {
            v.push((0..n).map(|_| rng.f() * mag).collect());
        }
        v.push(vec![0.0; n]);
        v.push((0..n).map(|_| rng.f() * 1e30).collect());
        let specials = [-1e30, -104.5, -103.9, -88.0, -87.3, 88.7, 88.8, 1e30];
        let mut x: Vec<f32> = (0..n).map(|i| specials[i % specials.len()]).collect();
        if n > 3 {
            x[n / 2] = f32::INFINITY;
            x[n / 3] = f32::NEG_INFINITY;
        }
        v.push(x.clone());
        x[n - 1] = f32::NAN;
        v.push(x);
    }
    v
}

/// Equal (both NaN counts as equal), or within `rel` of the reference, or both below the normal range.
fn op_close(got: f32, want: f32, rel: f32) -> bool {
    got.to_bits() == want.to_bits()
        || (got.is_nan() && want.is_nan())
        || (got - want).abs() <= rel * want.abs()
        || (got.abs() <= f32::MIN_POSITIVE && want.abs() <= f32::MIN_POSITIVE)
}

fn check_op(k: &Kernels, what: &str, x: &[f32], got: &[f32], want: &[f32]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            op_close(*g, *w, 1e-6),
            "{} {what} n={} [{i}] x={}: {g} vs {w}",
            k.isa.name(),
            x.len(),
            x[i]
        );
    }
}

/// Every table's element-wise ops against the scalar references: within 1e-6 relative on every length
/// 1..=70 (RoPE bit for bit: it rounds as the reference does).
#[test]
fn ops_match_scalar() {
    let s = scalar().ops;
    let mut rng = Rng(0x0b6);
    let inputs = op_inputs();
    for k in tables().into_iter().skip(1) {
        let o = k.ops;
        type Unary = fn(&mut [f32]);
        type Binary = fn(&mut [f32], &[f32]);
        let unary: [(&str, Unary, Unary); 4] = [
            ("exp", o.exp, s.exp),
            ("sigmoid", o.sigmoid, s.sigmoid),
            ("silu", o.silu, s.silu),
            ("softmax", o.softmax, s.softmax),
        ];
        let binary: [(&str, Binary, Binary); 3] = [
            ("swiglu", o.swiglu, s.swiglu),
            ("silu_mul", o.silu_mul, s.silu_mul),
            ("sigmoid_mul", o.sigmoid_mul, s.sigmoid_mul),
        ];
        for x in &inputs {
            for (name, f, r) in &unary {
                let (mut got, mut want) = (x.clone(), x.clone());
                f(&mut got);
                r(&mut want);
                check_op(k, name, x, &got, &want);
            }
            let y: Vec<f32> = x.iter().rev().map(|v| v * 0.5 + rng.f()).collect();
            for (name, f, r) in &binary {
                let (mut got, mut want) = (x.clone(), x.clone());
                f(&mut got, &y);
                r(&mut want, &y);
                check_op(k, name, x, &got, &want);
            }
            for eps in [1e-6f32, 1e-3] {
                let (mut got, mut want) = (x.clone(), x.clone());
                (o.l2_norm)(&mut got, eps);
                (s.l2_norm)(&mut want, eps);
                check_op(k, "l2_norm", x, &got, &want);
                let w: Vec<f32> = x.iter().map(|_| 1.0 + rng.f()).collect();
                let (mut got, mut want) = (x.clone(), x.clone());
                (o.rms_norm)(&mut got, &w, eps);
                (s.rms_norm)(&mut want, &w, eps);
                check_op(k, "rms_norm", x, &got, &want);
            }
            let half = x.len() / 2;
            let pos = (rng.next() % 300_000) as usize;
            let (cos, sin) = kernels::ops::rope_cos_sin(pos, 2 * half, 1e7);
            let (mut got, mut want) = (x.clone(), x.clone());
            (o.rope)(&mut got, &cos, &sin);
            (s.rope)(&mut want, &cos, &sin);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{} rope n={} half={half} [{i}]: {g} vs {w}",
                    k.isa.name(),
                    x.len()
                );
            }
        }
    }
}

/// Every table's conv + SiLU against the reference: the sums bit for bit (the SiLU within 1e-6, as
/// `silu`), over channel counts with and without a multiple of 8 lanes, 1 to 4 taps and 1 to 5 rows,
/// with an input window longer than needed.
#[test]
fn conv_silu_matches_scalar() {
    let s = scalar().ops;
    let mut rng = Rng(0xc0a7);
    for k in tables().into_iter().skip(1) {
        for c in [1, 3, 4, 8, 13, 16, 40, 6144 / 48] {
            for kk in 1..=4 {
                for rows in 1..=5 {
                    let taps: Vec<f32> = (0..kk * c).map(|_| rng.f()).collect();
                    let x: Vec<f32> = (0..(rows + kk) * c).map(|_| 4.0 * rng.f()).collect();
                    let (mut got, mut want) = (vec![f32::NAN; rows * c], vec![0.0; rows * c]);
                    (k.ops.conv_silu)(&taps, kk, &x, &mut got);
                    (s.conv_silu)(&taps, kk, &x, &mut want);
                    check_op(k, "conv_silu", &x, &got, &want);
                }
            }
        }
    }
}

/// Every table's delta-rule step equals the reference bit for bit: head sizes with and without a
/// multiple of 8 (`dk` 12 takes the reference path), several tokens in a row on the same state, decays
/// of 0, 1 and between, zero and large writes, steps in place and from another buffer.
#[test]
fn delta_step_matches_scalar() {
    let s = scalar().ops;
    let mut rng = Rng(0xde17a);
    for k in tables().into_iter().skip(1) {
        for (dk, dv) in [(8, 3), (16, 16), (12, 5), (128, 128), (64, 32)] {
            let init: Vec<f32> = (0..dk * dv).map(|_| rng.f()).collect();
            let (mut m_got, mut m_want) = (init.clone(), init);
            for step in 0..6 {
                let q: Vec<f32> = (0..dk).map(|_| rng.f() * 0.2).collect();
                let kk: Vec<f32> = (0..dk).map(|_| rng.f() * 0.2).collect();
                let v: Vec<f32> = (0..dv).map(|_| rng.f() * 4.0).collect();
                let decay = [0.0f32, 1.0, 0.97, 0.5, 1e-20, 0.999][step];
                let beta = [0.0f32, 1.0, 0.3, 0.9, 0.01, 0.5][step];
                let (mut o_got, mut o_want) = (vec![0f32; dv], vec![0f32; dv]);
                // Odd steps read the state from a copy and write it over stale values: the same
                // bits as in place.
                let from = (step % 2 == 1).then(|| m_got.clone());
                if from.is_some() {
                    m_got.iter_mut().for_each(|x| *x = f32::NAN);
                }
                (k.ops.delta_step)(
                    from.as_deref(),
                    &mut m_got,
                    &q,
                    &kk,
                    &v,
                    decay,
                    beta,
                    &mut o_got,
                );
                let from = (step % 3 == 2).then(|| m_want.clone());
                if from.is_some() {
                    m_want.fill(-1.0);
                }
                (s.delta_step)(
                    from.as_deref(),
                    &mut m_want,
                    &q,
                    &kk,
                    &v,
                    decay,
                    beta,
                    &mut o_want,
                );
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&o_got),
                    bits(&o_want),
                    "{} delta_step out dk={dk} dv={dv} step {step}",
                    k.isa.name()
                );
                assert_eq!(
                    bits(&m_got),
                    bits(&m_want),
                    "{} delta_step state dk={dk} dv={dv} step {step}",
                    k.isa.name()
                );
            }
        }
    }
}

/// Distance in units in the last place (0 for equal values, including both NaN or the same infinity).
fn ulps(a: f32, b: f32) -> u64 {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() {
            0
        } else {
            u64::MAX
        };
    }
    // Floats ordered as integers: negative values mirrored below zero.
    let ord = |x: f32| {
        let i = x.to_bits() as i32;
        (if i < 0 { i32::MIN - i } else { i }) as i64
    };
    ord(a).abs_diff(ord(b))
}

/// Every table's vector `exp` within 2 ulp of `f32::exp` over a dense sweep of [-110, 95] (overflow to
/// infinity, underflow through the subnormals to zero), small arguments around 0, and the specials.
#[test]
fn exp_within_2_ulp() {
    let mut x: Vec<f32> = (0..1_000_001)
        .map(|i| -110.0 + 205.0 * (i as f32 / 1_000_000.0))
        .collect();
    x.extend((-2000..=2000).map(|i| i as f32 * 1e-6));
    x.extend((-2000..=2000).map(|i| i as f32 * 1e-3));
    x.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        88.722_83,
        88.722_84,
        -87.336_55,
        -103.972_08,
        -103.279_3,
    ]);
    for k in tables().into_iter().skip(1) {
        let mut got = x.clone();
        (k.ops.exp)(&mut got);
        let mut worst = (0, 0.0f32);
        for (&xi, &g) in x.iter().zip(&got) {
            let d = ulps(g, xi.exp());
            if d > worst.0 {
                worst = (d, xi);
            }
        }
        eprintln!("{}: exp worst {} ulp at {}", k.isa.name(), worst.0, worst.1);
        assert!(
            worst.0 <= 2,
            "{}: exp({}) = {} is {} ulp from {}",
            k.isa.name(),
            worst.1,
            {
                let mut v = [worst.1];
                (k.ops.exp)(&mut v);
                v[0]
            },
            worst.0,
            worst.1.exp()
        );
    }
}

/// Inputs that exercise the quantizers' rounding, maxima and special values, 256 floats each.
fn quantizer_inputs() -> Vec<Vec<f32>> {
    let mut rng = Rng(99);
    let mut v: Vec<Vec<f32>> = Vec::new();
    v.push(vec![0.0; 256]);
    v.push(vec![-0.0; 256]);
    v.push((0..256).map(|_| rng.f()).collect());
    v.push((0..256).map(|_| rng.f() * 1e30).collect());
    v.push((0..256).map(|_| rng.f() * 1e-40).collect()); // subnormal maxima
                                                         // Exact ties: amax 127 makes d = 1, so x·id lands on halves (roundf vs ties-to-even).
    v.push(
        (0..256)
            .map(|i| match i % 32 {
                0 => 127.0,
                j => (j as f32 - 16.0) + 0.5,
            })
            .collect(),
    );
    // Q8_K ties: the first extreme is −127 → iscale = 1.
    v.push(
        (0..256)
            .map(|i| {
                if i == 3 {
                    -127.0
                } else {
                    (i % 40) as f32 - 19.5
                }
            })
            .collect(),
    );
    // Equal magnitudes of both signs: the first one's sign wins.
    v.push(
        (0..256)
            .map(|i| if i % 2 == 0 { 5.0 } else { -5.0 })
            .collect(),
    );
    v.push(
        (0..256)
            .map(|i| if i % 2 == 0 { -5.0 } else { 5.0 })
            .collect(),
    );
    let mut special = (0..256).map(|_| rng.f()).collect::<Vec<f32>>();
    special[5] = f32::NAN;
    special[40] = f32::INFINITY;
    special[200] = f32::NEG_INFINITY;
    v.push(special);
    let mut inf = (0..256).map(|_| rng.f()).collect::<Vec<f32>>();
    inf[70] = f32::INFINITY;
    v.push(inf);
    let mut nan = vec![1.0; 256];
    nan[255] = f32::NAN;
    v.push(nan);
    v.push(vec![f32::NAN; 256]);
    v.push((0..256).map(|i| (i as f32 * 0.37).sin() * 3.0).collect());
    v
}

#[test]
fn quantize_act_matches_scalar_bytes() {
    for k in tables().into_iter().skip(1) {
        for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
            let all = quantizer_inputs();
            for (i, x) in all.iter().enumerate() {
                let rb = ty.row_bytes(x.len() as u64).unwrap() as usize;
                let (mut want, mut got) = (vec![0u8; rb], vec![0xAAu8; rb]);
                (scalar().quantize_act)(ty, x, &mut want);
                (k.quantize_act)(ty, x, &mut got);
                assert_eq!(got, want, "{} {ty} input {i}", k.isa.name());
            }
            // A long row: all inputs back to back.
            let x: Vec<f32> = all.concat();
            let rb = ty.row_bytes(x.len() as u64).unwrap() as usize;
            let (mut want, mut got) = (vec![0u8; rb], vec![0u8; rb]);
            (scalar().quantize_act)(ty, &x, &mut want);
            (k.quantize_act)(ty, &x, &mut got);
            assert_eq!(got, want, "{} {ty} long row", k.isa.name());
        }
    }
}

/// Child side of the subprocess tests: does nothing unless `DELTAQ_TEST_CHILD` is set.
#[test]
fn child_probe() {
    let Ok(what) = std::env::var("DELTAQ_TEST_CHILD") else {
        return;
    };
    println!("probe-isa={}", kernels::kernels().isa.name());
    if let Some(rest) = what.strip_prefix("logits:") {
        let (model, out) = rest.split_once('|').unwrap();
        let logits = run_model(model);
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(out, bytes).unwrap();
    }
}

/// Runs this test binary's `child_probe` with `DELTAQ_ISA=isa`; returns its output. Under emulation
/// `DELTAQ_TEST_RUNNER` (e.g. "qemu-aarch64-static -cpu cortex-a76") starts the child, as cargo's
/// runner started this process.
fn run_child(isa: &str, what: &str) -> String {
    let exe = std::env::current_exe().unwrap();
    let runner = std::env::var("DELTAQ_TEST_RUNNER").unwrap_or_default();
    let mut argv: Vec<std::ffi::OsString> = runner.split_whitespace().map(Into::into).collect();
    argv.push(exe.into());
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .args(["--exact", "child_probe", "--nocapture", "--test-threads=1"])
        .env("DELTAQ_ISA", isa)
        .env("DELTAQ_TEST_CHILD", what)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child with DELTAQ_ISA={isa} failed:\n{text}"
    );
    text
}

#[test]
fn deltaq_isa_forces_a_table() {
    for k in tables() {
        let out = run_child(k.isa.name(), "isa");
        assert!(
            out.contains(&format!("probe-isa={}\n", k.isa.name())),
            "DELTAQ_ISA={} gave:\n{out}",
            k.isa.name()
        );
    }
    // Upper case works too; an unknown name falls back to the best table with a warning.
    assert!(run_child("SCALAR", "isa").contains("probe-isa=scalar\n"));
    let best = tables().last().unwrap().isa.name();
    let out = run_child("no-such-isa", "isa");
    assert!(out.contains(&format!("probe-isa={best}\n")), "{out}");
    assert!(out.contains("warning: DELTAQ_ISA=no-such-isa"), "{out}");
}

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

/// Logits of a batch forward of the golden tokens, then two single-token steps.
fn run_model(path: &str) -> Vec<f32> {
    use deltaq::gguf::GgufFile;
    use deltaq::model::{Model, Session};
    let f = GgufFile::open(path).unwrap();
    let model = Model::load(&f).unwrap();
    let tokens: Vec<u32> = deltaq::npy::read(&fixture("tiny-r2/golden/tokens.npy"))
        .unwrap()
        .data
        .iter()
        .map(|&t| t as u32)
        .collect();
    let mut s = Session::new(&model, None);
    let mut logits = s.forward(&tokens).unwrap();
    for &t in &tokens[..2] {
        logits.extend(s.forward(&[t]).unwrap());
    }
    logits
}

#[test]
fn model_logits_same_with_every_isa() {
    // (file, bound on max |Δ| / max |logit|, bound on rms(Δ) / rms(logits)). Float weights only differ
    // by the association of f32 sums. With quantized weights the activations are re-quantized to 8 bits
    // at every layer: a last-bit difference that moves one value across a rounding boundary changes it
    // by a full quantization step, and this tiny random-weight model amplifies that (perturbing the
    // scalar kernel's outputs by 1.2e-7 relative moves its logits by up to ~5% of their range, the
    // same as switching ISA), so those bounds are statistical: a wrong kernel moves logits by O(100%).
    for (file, max_rel, rms_rel) in [
        ("tiny-r2/tiny-r2-F16.gguf", 1e-4, 1e-5),
        ("tiny-r2/quant/tiny-r2-Q4_K_M.gguf", 0.15, 0.06),
        ("tiny-r2/quant/tiny-r2-pure-Q8_0.gguf", 0.15, 0.06),
    ] {
        let path = fixture(file);
        let dir = tempfile::tempdir().unwrap();
        let mut results: Vec<(&str, Vec<f32>)> = Vec::new();
        for k in tables() {
            let out = dir.path().join(format!("{}.bin", k.isa.name()));
            let what = format!("logits:{}|{}", path.display(), out.display());
            let text = run_child(k.isa.name(), &what);
            assert!(
                text.contains(&format!("probe-isa={}\n", k.isa.name())),
                "{text}"
            );
            let bytes = std::fs::read(&out).unwrap();
            let logits: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            results.push((k.isa.name(), logits));
        }
        let (_, base) = &results[0];
        let rms = |v: &mut dyn Iterator<Item = f32>| {
            let (s, n) = v.fold((0f64, 0usize), |(s, n), x| (s + (x as f64).powi(2), n + 1));
            (s / n.max(1) as f64).sqrt()
        };
        let scale = base.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let base_rms = rms(&mut base.iter().copied());
        for (name, l) in &results[1..] {
            assert_eq!(l.len(), base.len());
            assert!(
                l.iter().all(|v| v.is_finite()),
                "{file}: {name} logits not finite"
            );
            let diff = l
                .iter()
                .zip(base)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max) as f64;
            let diff_rms = rms(&mut l.iter().zip(base).map(|(a, b)| a - b));
            eprintln!(
                "{file}: {name} vs scalar: max |Δ| {:.2e} of max |logit| {scale:.3}, rms Δ {:.2e} of rms {base_rms:.3}",
                diff, diff_rms
            );
            assert!(
                diff <= max_rel * scale && diff_rms <= rms_rel * base_rms,
                "{file}: {name} logits differ from scalar: max {diff}, rms {diff_rms}"
            );
        }
    }
}

/// Decode (one token per call) and prefill (several tokens per call) give bit-identical outputs on every
/// table: the model's batch-vs-step check relies on it, and the kernels use different tile shapes.
#[test]
fn decode_equals_prefill_bitwise() {
    for k in tables() {
        for (ti, ty) in QUANT_TYPES.into_iter().enumerate() {
            let n = 3 * ty.block_size();
            for (rows, n_tok) in [(9, 5), (8, 4), (5, 7), (9, 17), (3, 16)] {
                let mut rng = Rng(ti as u64 * 31 + rows as u64);
                let w = weight_rows(ty, rows, n, Fill::Random, &mut rng);
                let x = activations(n_tok, n, &mut rng);
                let qa = quantize_acts(ty, &x, n);
                let ab = qa.len() / n_tok;
                let mut batch = vec![0f32; rows * n_tok];
                (k.quant_rows)(ty, &w, &qa, n_tok, &mut batch);
                for t in 0..n_tok {
                    let mut one = vec![0f32; rows];
                    (k.quant_rows)(ty, &w, &qa[t * ab..(t + 1) * ab], 1, &mut one);
                    for r in 0..rows {
                        assert_eq!(
                            batch[r * n_tok + t].to_bits(),
                            one[r].to_bits(),
                            "{} {ty} rows={rows} n_tok={n_tok} row {r} tok {t}",
                            k.isa.name()
                        );
                    }
                }
            }
        }
    }
}

/// The prefill GEMMs (tables that have one) give bit-identical results to the same table's row
/// products, on edge-case panels (row counts around the 16-row panel, token counts around the 8-token
/// tile) and on zero, maximal and high-scale blocks; so they also equal decode and the scalar reference's
/// integers.
#[test]
fn quant_gemm_equals_quant_rows_bitwise() {
    for k in tables() {
        let Some(g) = k.quant_gemm else { continue };
        for (ti, ty) in QUANT_TYPES.into_iter().enumerate() {
            if !(g.supports)(ty) {
                continue;
            }
            let bs = ty.block_size();
            let cases = [
                (1, 1, 1, Fill::Random),
                (16, 8, 2, Fill::Random),
                (17, 9, 3, Fill::Random),
                (33, 15, 1, Fill::Random),
                (5, 31, 4, Fill::Random),
                (64, 70, 2, Fill::Random),
                (20, 17, 2, Fill::Random),
                (3, 16, 1, Fill::Random),
                // 32 tokens and more: the AMX table's two 16-token tile groups, then a 16-token one.
                (17, 48, 3, Fill::High),
                (7, 35, 2, Fill::Ones),
                // Rows × columns past what the AMX GEMM unpacks at once: its column chunks.
                (160, 33, 8, Fill::Random),
                (16, 8, 2, Fill::Zero),
                (18, 11, 2, Fill::Ones),
                (18, 11, 2, Fill::High),
                // One token: the 4-row decode kernels (on AVX-512 their 512-bit forms) against the GEMM.
                (37, 1, 3, Fill::Random),
                (8, 1, 2, Fill::High),
                (12, 1, 1, Fill::Ones),
            ];
            // Largest codes against constant activations (every Q8_K value −128): the largest
            // integer sums a sub-block can reach, which must not overflow any narrower form.
            let extreme = [
                (18, 11, 2, Fill::Ones),
                (16, 9, 1, Fill::High),
                (18, 34, 2, Fill::Ones),
                (16, 33, 1, Fill::High),
            ];
            for (case, (rows, n_tok, blocks, fill)) in cases.into_iter().chain(extreme).enumerate()
            {
                let n = blocks * bs;
                let mut rng = Rng(ti as u64 * 977 + rows as u64 * 13 + n_tok as u64);
                let w = weight_rows(ty, rows, n, fill, &mut rng);
                let x = if case >= cases.len() {
                    (0..n_tok * n)
                        .map(|i| if (i / n) % 2 == 0 { 1.0 } else { -0.5 })
                        .collect()
                } else {
                    activations(n_tok, n, &mut rng)
                };
                let qa = quantize_acts(ty, &x, n);
                let mut want = vec![0f32; rows * n_tok]; // [rows × n_tok]
                (k.quant_rows)(ty, &w, &qa, n_tok, &mut want);
                let mut got = vec![f32::NAN; n_tok * rows]; // [n_tok × rows]
                (g.run)(ty, &w, &qa, kernels::GemmOut::new(&mut got, n_tok));
                // The entry that also takes the quants as aligned rows (AMX), where there is one.
                let mut got_q = None;
                if let Some(q) = g.run_quants.filter(|q| (q.supports)(ty)) {
                    let mut buf = (Vec::new(), Vec::new());
                    kernels::q8k_quants(&qa, n, &mut buf);
                    let qs = kernels::Q8kQuants {
                        lines: &buf.0,
                        sums32: &buf.1,
                        n_in: n,
                    };
                    let mut o = vec![f32::NAN; n_tok * rows];
                    (q.run)(ty, &w, &qa, qs, kernels::GemmOut::new(&mut o, n_tok));
                    got_q = Some(o);
                }
                for (entry, got) in [("run", Some(&got)), ("run_quants", got_q.as_ref())] {
                    let Some(got) = got else { continue };
                    for r in 0..rows {
                        for t in 0..n_tok {
                            assert_eq!(
                                got[t * rows + r].to_bits(),
                                want[r * n_tok + t].to_bits(),
                                "{} {entry} {ty} {fill:?} rows={rows} n_tok={n_tok} n={n} row {r} tok {t}: {} vs {}",
                                k.isa.name(),
                                got[t * rows + r],
                                want[r * n_tok + t]
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The x86 kernels of the lattice IQ types (IQ3, IQ2, IQ1) form each block's exact integer sum and then
/// take the scalar reference's float steps, so their row products, and the prefill GEMM where the table
/// has one, equal the scalar reference bit for bit (IQ4_XS's reference scales per 32-element sub-block in
/// float, so there only GEMM = rows holds).
#[test]
fn x86_lattice_iq_kernels_equal_scalar_bitwise() {
    use GgmlType as G;
    let types = [
        G::IQ3_XXS,
        G::IQ3_S,
        G::IQ2_XXS,
        G::IQ2_XS,
        G::IQ2_S,
        G::IQ1_S,
        G::IQ1_M,
    ];
    for k in tables() {
        if !matches!(k.isa, Isa::Avx2 | Isa::Avx512 | Isa::Amx) {
            continue;
        }
        for (ti, ty) in types.into_iter().enumerate() {
            for (rows, n_tok, blocks, fill) in [
                (5, 1, 3, Fill::Random),
                (17, 3, 2, Fill::Random),
                (19, 17, 2, Fill::Random),
                (18, 11, 1, Fill::Ones),
                (18, 11, 1, Fill::High),
            ] {
                let n = blocks * ty.block_size();
                let mut rng = Rng(ti as u64 * 131 + rows as u64 * 7 + n_tok as u64);
                let w = weight_rows(ty, rows, n, fill, &mut rng);
                let x = activations(n_tok, n, &mut rng);
                let qa = quantize_acts(ty, &x, n);
                let mut want = vec![0f32; rows * n_tok];
                (scalar().quant_rows)(ty, &w, &qa, n_tok, &mut want);
                let mut rows_out = vec![f32::NAN; rows * n_tok];
                (k.quant_rows)(ty, &w, &qa, n_tok, &mut rows_out);
                let gemm = k.quant_gemm.filter(|g| (g.supports)(ty)).map(|g| {
                    let mut got = vec![f32::NAN; n_tok * rows];
                    (g.run)(ty, &w, &qa, kernels::GemmOut::new(&mut got, n_tok));
                    got
                });
                for r in 0..rows {
                    for t in 0..n_tok {
                        let e = want[r * n_tok + t];
                        let what = format!(
                            "{} {ty} {fill:?} rows={rows} n_tok={n_tok} row {r} tok {t}",
                            k.isa.name()
                        );
                        assert_eq!(
                            rows_out[r * n_tok + t].to_bits(),
                            e.to_bits(),
                            "rows: {what}"
                        );
                        if let Some(g) = &gemm {
                            assert_eq!(g[t * rows + r].to_bits(), e.to_bits(), "gemm: {what}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn streamed_sum_is_the_plain_sum() {
    let words: Vec<u64> = (0..10_000u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    for n in [0, 1, 7, 31, 32, 33, 100, 4096, 9_999, 10_000] {
        let w = &words[..n];
        let plain = w.iter().fold(0u64, |s, x| s.wrapping_add(*x));
        assert_eq!(deltaq::kernels::sum_words_streamed(w), plain, "{n} words");
    }
}

/// `matmul` with a few tokens (speculative decoding's verification step: 2 to 4, and every count below
/// the prefill GEMM's and just past it) gives, per (token, row), exactly the f32 bits of one-token calls,
/// on every table, for every weight type, with 1 and 2 threads: greedy speculative decoding is
/// token-identical to plain decoding only if it does. The shapes cover rows left over by the kernels'
/// row tiles and work items of more rows than `matmul`'s transposition buffer takes at once.
#[test]
fn few_token_matmul_equals_one_token_bitwise() {
    use deltaq::kernels::{matmul_with, Weight};
    let floats = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];
    for k in tables() {
        for (ti, ty) in QUANT_TYPES.into_iter().chain(floats).enumerate() {
            let float = floats.contains(&ty);
            let bs = if float { 1 } else { ty.block_size() };
            for (rows, n, counts) in [
                (37, 3 * bs.max(19), (1..=17).collect::<Vec<_>>()),
                (2602, 256, vec![2, 3, 4]),
            ] {
                let mut rng = Rng(ti as u64 * 7919 + rows as u64);
                let w = if float {
                    let wf: Vec<f32> = (0..rows * n).map(|_| rng.f() * 3.0).collect();
                    let mut w = vec![0u8; ty.row_bytes((rows * n) as u64).unwrap() as usize];
                    quant::quantize_row(ty, &wf, &mut w).unwrap();
                    w
                } else {
                    weight_rows(ty, rows, n, Fill::Random, &mut rng)
                };
                let weight = Weight {
                    name: "w",
                    ty,
                    n_in: n,
                    n_out: rows,
                    data: &w,
                };
                let max = *counts.iter().max().unwrap();
                let x = activations(max, n, &mut rng);
                for threads in [1, 2] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let one: Vec<Vec<f32>> = (0..max)
                        .map(|t| {
                            let mut o = vec![f32::NAN; rows];
                            pool.install(|| matmul_with(k, &weight, &x[t * n..][..n], 1, &mut o));
                            o
                        })
                        .collect();
                    for &n_tok in &counts {
                        let mut got = vec![f32::NAN; n_tok * rows]; // [n_tok × rows]
                        pool.install(|| matmul_with(k, &weight, &x[..n_tok * n], n_tok, &mut got));
                        for t in 0..n_tok {
                            for r in 0..rows {
                                let (g, o) = (got[t * rows + r], one[t][r]);
                                assert!(
                                    g.to_bits() == o.to_bits() || (g.is_nan() && o.is_nan()),
                                    "{} {ty} rows={rows} n={n} n_tok={n_tok} threads={threads} \
                                     row {r} tok {t}: {g} vs one token {o}",
                                    k.isa.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Several queries over one KV head at once (the tiled prefill and GQA path) give every query the same
/// bits as that table's one-query entry, for f32, f16, Q8_0 and Q4_0 caches, queries seeing different
/// numbers of positions (causal prefill) or the same (groups of up to 16), across score blocks, pages
/// and softmax chunks; and split-K
/// (the chunks computed in separate calls, then merged) gives the same bits again.
#[test]
fn attend_many_equals_one_at_a_time() {
    use deltaq::kernels::attend_quant::attend_quant_many_with;
    let _ftz = deltaq::kernels::fpenv::FlushDenormals::new();
    let (hd, nkv, n_all) = (64, 2, 2 * CHUNK + 400);
    let stride = nkv * hd;
    // Then runs of queries that see the same positions, as a prefill tile far from the causal edge
    // makes: 17 (AVX-512 groups 16 and takes two 8-query score tiles in turns, then 1) and 12 (8 + 4).
    let mut n_ctx = vec![1usize, n_all, 128, CHUNK + 1, 7, CHUNK, 2 * CHUNK + 1, 300];
    n_ctx.extend([n_all; 17]);
    n_ctx.extend([CHUNK + 1; 12]);
    for k in tables() {
        for page_rows in [KV_PAGE, 100] {
            let mut rng = Rng(41 + page_rows as u64);
            let kf: Vec<f32> = (0..n_all * stride).map(|_| rng.f()).collect();
            let vf: Vec<f32> = (0..n_all * stride).map(|_| rng.f()).collect();
            let qs: Vec<f32> = (0..n_ctx.len() * hd).map(|_| 6.0 * rng.f()).collect();
            let scale = 0.125;
            let (kp, vp) = (
                pages::<f16>(&kf, page_rows * stride),
                pages::<f16>(&vf, page_rows * stride),
            );
            let (k32, v32) = (
                pages::<f32>(&kf, page_rows * stride),
                pages::<f32>(&vf, page_rows * stride),
            );
            for m in 0..nkv {
                let mut many = vec![f32::NAN; qs.len()];
                let kv = KvPages {
                    k: &kp,
                    v: &vp,
                    page_rows,
                    stride,
                    offset: m * hd,
                };
                (k.attend_many_f16)(&qs, &n_ctx, kv, scale, AttnOut::Whole(&mut many));
                let split = |run: &dyn Fn(AttnOut<'_>)| {
                    // Chunks 0 and 1..3 in two calls, merged.
                    let nq = n_ctx.len();
                    let mut stats = vec![ChunkStat::EMPTY; 3 * nq];
                    let mut parts = vec![f32::NAN; 3 * qs.len()];
                    let (s0, s1) = stats.split_at_mut(nq);
                    let (p0, p1) = parts.split_at_mut(qs.len());
                    run(AttnOut::Chunks {
                        first: 0,
                        o: p0,
                        stats: s0,
                    });
                    run(AttnOut::Chunks {
                        first: 1,
                        o: p1,
                        stats: s1,
                    });
                    let mut out = vec![f32::NAN; qs.len()];
                    merge_chunks(&stats, &parts, &mut out);
                    out
                };
                let merged = split(&|out| (k.attend_many_f16)(&qs, &n_ctx, kv, scale, out));
                assert_eq!(many, merged, "{} f16 split-K, KV head {m}", k.isa.name());
                let kv32 = KvPages {
                    k: &k32,
                    v: &v32,
                    page_rows,
                    stride,
                    offset: m * hd,
                };
                let mut many32 = vec![f32::NAN; qs.len()];
                (k.attend_many_f32)(&qs, &n_ctx, kv32, scale, AttnOut::Whole(&mut many32));
                let merged = split(&|out| (k.attend_many_f32)(&qs, &n_ctx, kv32, scale, out));
                assert_eq!(many32, merged, "{} f32 split-K, KV head {m}", k.isa.name());
                for (i, &n) in n_ctx.iter().enumerate() {
                    let q = &qs[i * hd..][..hd];
                    let mut one = vec![f32::NAN; hd];
                    (k.attend_f16)(q, kv, n, scale, &mut one);
                    assert_eq!(
                        &many[i * hd..][..hd],
                        &one[..],
                        "{} f16 query {i}",
                        k.isa.name()
                    );
                    (k.attend_f32)(q, kv32, n, scale, &mut one);
                    assert_eq!(
                        &many32[i * hd..][..hd],
                        &one[..],
                        "{} f32 query {i}",
                        k.isa.name()
                    );
                }
            }
            #[allow(clippy::too_many_arguments)]
            fn quant_case<B: KvBlock>(
                k: &Kernels,
                kf: &[f32],
                vf: &[f32],
                qs: &[f32],
                n_ctx: &[usize],
                page_rows: usize,
                stride: usize,
                hd: usize,
            ) {
                let (kp, vp) = (
                    pages::<B>(kf, page_rows * stride),
                    pages::<B>(vf, page_rows * stride),
                );
                let nb = hd / 32;
                let kv = KvPages {
                    k: &kp,
                    v: &vp,
                    page_rows,
                    stride: stride / 32,
                    offset: nb,
                };
                let mut many = vec![f32::NAN; qs.len()];
                attend_quant_many_with(k, qs, n_ctx, kv, 0.125, AttnOut::Whole(&mut many));
                let nq = n_ctx.len();
                let mut stats = vec![ChunkStat::EMPTY; 3 * nq];
                let mut parts = vec![f32::NAN; 3 * qs.len()];
                for (c, (o, st)) in parts
                    .chunks_exact_mut(qs.len())
                    .zip(stats.chunks_exact_mut(nq))
                    .enumerate()
                {
                    let out = AttnOut::Chunks {
                        first: c,
                        o,
                        stats: st,
                    };
                    attend_quant_many_with(k, qs, n_ctx, kv, 0.125, out);
                }
                let mut merged = vec![f32::NAN; qs.len()];
                merge_chunks(&stats, &parts, &mut merged);
                assert_eq!(many, merged, "{} {:?} split-K", k.isa.name(), B::TYPE);
                for (i, &n) in n_ctx.iter().enumerate() {
                    let mut one = vec![f32::NAN; hd];
                    attend_quant_with(k, &qs[i * hd..][..hd], kv, n, 0.125, &mut one);
                    assert_eq!(
                        &many[i * hd..][..hd],
                        &one[..],
                        "{} {:?} query {i}",
                        k.isa.name(),
                        B::TYPE
                    );
                }
            }
            quant_case::<BlockQ8_0>(k, &kf, &vf, &qs, &n_ctx, page_rows, stride, hd);
            quant_case::<BlockQ4_0>(k, &kf, &vf, &qs, &n_ctx, page_rows, stride, hd);
        }
    }
}
