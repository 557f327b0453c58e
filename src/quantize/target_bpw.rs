//! `quantize --target-bpw N`: a type per tensor so that the file has at most N bits per weight and the
//! predicted damage is smallest (llama-quantize has no such option; this is deltaq's own recipe).
//!
//! Bits per weight are counted as the perplexity table counts them: the bytes of every tensor's data
//! (quantized or not, norms included) × 8 over the number of weights of all tensors; metadata and
//! alignment padding are not counted.
//!
//! 1. Measure: every quantizable tensor is quantized to every candidate type its rows allow (with its
//!    importance weights, exactly as it would be written), dequantized, and its error taken as
//!    `Σ w_j (x_j − q_j)²` with `w_j` the importance matrix's mean squared activation of column `j`
//!    (1 without a matrix): the expected squared error of the matmul's output. Divided by the same sum
//!    of `w_j x_j²` it is the output's relative error, comparable between tensors. Large tensors are
//!    measured on an even sample of their rows.
//! 2. Allocate: minimise `Σ sensitivity_t · error_t(type_t)` subject to `Σ bits ≤ budget` by a Lagrangian
//!    sweep (each tensor takes `argmin error + λ·bits`; λ bisected to the smallest file within the
//!    budget), then a greedy fill of the slack (the upgrade with the most error saved per bit, while one fits).

use std::path::Path;

use anyhow::{bail, ensure, Context};
use rayon::prelude::*;

use super::{
    check_quantizers, imatrix_metadata, is_quantizable, matches_pattern, progress_bar, same_file,
    set_last, sort_like_llama_quantize, tensor_requires_imatrix, tensor_weights,
    write_gguf_weighted, FileType, GgufTensor, Planned, QuantizeOptions, Summary, TensorSource,
};
use crate::gguf::{GgufFile, GgufWriter, OwnedValue};
use crate::quant::{dequantize_row, quantize_row_imatrix, GgmlType};

/// The types a tensor may get, from fewest to most bits per weight (those whose block does not divide a
/// tensor's rows are left out for it).
pub const CANDIDATES: [GgmlType; 18] = [
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::Q2_K,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::Q3_K,
    GgmlType::IQ4_XS,
    GgmlType::IQ4_NL,
    GgmlType::Q4_0,
    GgmlType::Q4_K,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
];

/// Rows measured per tensor at most by default (evenly spaced); the error is scaled to all rows.
pub const MAX_SAMPLE_ROWS: usize = 1024;

/// One candidate type of one tensor: its size and its (sensitivity-weighted) error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    pub ty: GgmlType,
    pub bits: u64,
    pub error: f64,
}

/// For each tensor, the index of the choice minimising `error + λ·bits` (the fewer bits on a tie).
/// The total bits never grow with λ.
pub fn pick_for_lambda(tensors: &[Vec<Choice>], lambda: f64) -> Vec<usize> {
    tensors
        .iter()
        .map(|cs| {
            let cost = |c: &Choice| c.error + lambda * c.bits as f64;
            (0..cs.len())
                .min_by(|&a, &b| {
                    cost(&cs[a])
                        .total_cmp(&cost(&cs[b]))
                        .then(cs[a].bits.cmp(&cs[b].bits))
                })
                .expect("every tensor has a choice")
        })
        .collect()
}

fn total_bits(tensors: &[Vec<Choice>], pick: &[usize]) -> u64 {
    tensors.iter().zip(pick).map(|(cs, &i)| cs[i].bits).sum()
}

/// The choice per tensor with the least total error whose bits sum to at most `budget`: the Lagrangian
/// solution nearest the budget, then the greedy fill of what is left. An error if even the smallest
/// choices do not fit, or a tensor has none.
pub fn allocate(tensors: &[Vec<Choice>], budget: u64) -> anyhow::Result<Vec<usize>> {
    ensure!(
        tensors.iter().all(|cs| !cs.is_empty()),
        "a tensor has no candidate type"
    );
    let smallest: Vec<usize> = tensors
        .iter()
        .map(|cs| {
            (0..cs.len())
                .min_by(|&a, &b| {
                    cs[a]
                        .bits
                        .cmp(&cs[b].bits)
                        .then(cs[a].error.total_cmp(&cs[b].error))
                })
                .expect("not empty")
        })
        .collect();
    let min_bits = total_bits(tensors, &smallest);
    ensure!(
        min_bits <= budget,
        "the smallest choices take {min_bits} bits, more than the budget of {budget}"
    );
    let mut pick = pick_for_lambda(tensors, 0.0);
    if total_bits(tensors, &pick) > budget {
        // Above the largest error saved per bit every tensor takes its smallest choice.
        let mut hi = tensors
            .iter()
            .flat_map(|cs| {
                cs.iter().flat_map(move |a| {
                    cs.iter()
                        .filter(move |b| b.bits > a.bits)
                        .map(move |b| (a.error - b.error) / (b.bits - a.bits) as f64)
                })
            })
            .fold(0.0f64, f64::max)
            * 2.0
            + f64::MIN_POSITIVE;
        let mut lo = 0.0;
        pick = pick_for_lambda(tensors, hi);
        if total_bits(tensors, &pick) > budget {
            pick = smallest;
        }
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if mid <= lo || mid >= hi {
                break;
            }
            let p = pick_for_lambda(tensors, mid);
            if total_bits(tensors, &p) <= budget {
                hi = mid;
                pick = p;
            } else {
                lo = mid;
            }
        }
    }
    fill_slack(tensors, &mut pick, budget);
    Ok(pick)
}

/// Spends what the budget has left: the upgrade (any tensor to any larger choice) saving the most error
/// per added bit, as long as one fits.
fn fill_slack(tensors: &[Vec<Choice>], pick: &mut [usize], budget: u64) {
    let mut used = total_bits(tensors, pick);
    loop {
        let slack = budget - used;
        let mut best: Option<(f64, usize, usize)> = None;
        for (t, cs) in tensors.iter().enumerate() {
            let cur = cs[pick[t]];
            for (k, c) in cs.iter().enumerate() {
                if c.bits > cur.bits && c.bits - cur.bits <= slack && c.error < cur.error {
                    let gain = (cur.error - c.error) / (c.bits - cur.bits) as f64;
                    if best.is_none_or(|(g, _, _)| gain > g) {
                        best = Some((gain, t, k));
                    }
                }
            }
        }
        let Some((_, t, k)) = best else { break };
        used = used - tensors[t][pick[t]].bits + tensors[t][k].bits;
        pick[t] = k;
    }
}

/// How much the output head's relative error counts against another tensor's: its error reaches the
/// logits directly, and llama.cpp's recipes give it 5–6.6 bits where the rest get 2–3. Measured on the
/// demo model (eval-john, KL from F32, 16 windows): ×1 gave KL 0.846 at 2.75 bpw and 0.189 at 3.5;
/// ×4 0.380 / 0.120; ×16 0.340 / 0.106; ×64 0.354 / 0.106. Weighting tensors by √size as well was worse.
const HEAD_SENSITIVITY: f64 = 16.0;

/// How much a tensor's relative output error counts. The embedding of a model with tied embeddings is
/// also the output head.
fn sensitivity(name: &str, tied_output: bool) -> f64 {
    let head = name == "output.weight" || (tied_output && name == "token_embd.weight");
    if head {
        HEAD_SENSITIVITY
    } else {
        1.0
    }
}

/// A quantizable tensor: its source, importance weights and candidate types.
struct Target<'a, 'm> {
    src: GgufTensor<'a>,
    weights: Option<&'m [f32]>,
    types: Vec<GgmlType>,
}

/// The types `name` (rows of `row_len`) may get: whole blocks per row, and with importance weights
/// where llama-quantize requires them (the quantizers that cannot run without are skipped too).
fn candidate_types(name: &str, row_len: u64, has_weights: bool) -> Vec<GgmlType> {
    let mut v: Vec<GgmlType> = CANDIDATES
        .into_iter()
        .filter(|t| t.row_bytes(row_len).is_some())
        .filter(|&t| {
            has_weights
                || !(tensor_requires_imatrix(name, t, FileType::Q2_K)
                    || crate::quant::quantize_requires_imatrix(t))
        })
        .collect();
    if v.is_empty() {
        v.push(GgmlType::F16);
    }
    v
}

/// Rows to measure: all, or `max` evenly spaced.
fn sample_rows(n_rows: usize, max: usize) -> Vec<usize> {
    let max = max.max(1);
    if n_rows <= max {
        return (0..n_rows).collect();
    }
    (0..max).map(|i| i * n_rows / max).collect()
}

/// `Σ w (x − q)²` for `x` quantized to `ty` with weights `w` (unit weights when `None`).
fn row_error(ty: GgmlType, x: &[f32], w: Option<&[f32]>) -> anyhow::Result<f64> {
    let n = x.len() as u64;
    let mut q = vec![0u8; ty.row_bytes(n).context("row length")? as usize];
    quantize_row_imatrix(ty, x, w, &mut q)?;
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut y)?;
    let mut e = 0f64;
    for (j, (&a, &b)) in x.iter().zip(&y).enumerate() {
        let d = (a - b) as f64;
        e += w.map_or(1.0, |w| w[j] as f64) * d * d;
    }
    Ok(e)
}

/// Each candidate's relative error for `t`, times `scale`, with bits of the whole tensor.
fn measure(
    t: &Target<'_, '_>,
    scale: f64,
    max_rows: usize,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<Choice>> {
    let row_len = t.src.row_len() as usize;
    let n_rows = t.src.n_rows() as usize;
    let rows_per_expert = t.src.ne().get(1).copied().unwrap_or(1).max(1) as usize;
    let rows = sample_rows(n_rows, max_rows);
    let mut x = vec![0f32; rows.len() * row_len];
    for (i, &r) in rows.iter().enumerate() {
        t.src
            .read_rows(r as u64, &mut x[i * row_len..(i + 1) * row_len])?;
    }
    if let Some(v) = x.iter().find(|v| !v.is_finite()) {
        bail!("tensor '{}' holds the non-finite value {v}", t.src.name());
    }
    let weights = |i: usize| {
        t.weights.map(|w| {
            let e = rows[i] / rows_per_expert;
            &w[e * row_len..(e + 1) * row_len]
        })
    };
    let signal: f64 = (0..rows.len())
        .map(|i| {
            let xr = &x[i * row_len..(i + 1) * row_len];
            let w = weights(i);
            xr.iter()
                .enumerate()
                .map(|(j, &v)| w.map_or(1.0, |w| w[j] as f64) * (v as f64) * (v as f64))
                .sum::<f64>()
        })
        .sum();
    let n = rows.len();
    let errors: Vec<f64> = (0..t.types.len() * n)
        .into_par_iter()
        .map(|k| {
            let (ti, i) = (k / n, k % n);
            let e = row_error(t.types[ti], &x[i * row_len..(i + 1) * row_len], weights(i));
            bar.inc(row_len as u64);
            e
        })
        .collect::<anyhow::Result<_>>()
        .with_context(|| format!("tensor '{}'", t.src.name()))?;
    Ok(t.types
        .iter()
        .enumerate()
        .map(|(ti, &ty)| {
            let sse: f64 = errors[ti * n..(ti + 1) * n].iter().sum();
            let rel = if signal > 0.0 { sse / signal } else { 0.0 };
            Choice {
                ty,
                bits: ty.row_bytes(row_len as u64).expect("candidate") * n_rows as u64 * 8,
                error: scale * rel,
            }
        })
        .collect())
}

/// The `general.file_type` of a mixed file: the ftype llama.cpp's loader would guess from the type
/// most of the quantized tensors have (its table: Q3_K → Q3_K_M, Q4_K → Q4_K_M, Q5_K → Q5_K_M).
fn guessed_file_type(types: &[GgmlType]) -> FileType {
    let mut counts: Vec<(GgmlType, usize)> = Vec::new();
    for &t in types {
        match counts.iter_mut().find(|(u, _)| *u == t) {
            Some(c) => c.1 += 1,
            None => counts.push((t, 1)),
        }
    }
    let most = counts
        .iter()
        .max_by_key(|c| c.1)
        .map_or(GgmlType::F32, |c| c.0);
    let name = match most {
        GgmlType::Q3_K => "Q3_K_M",
        GgmlType::Q4_K => "Q4_K_M",
        GgmlType::Q5_K => "Q5_K_M",
        other => other.name(),
    };
    FileType::from_name(name).unwrap_or(FileType::F32)
}

/// What `--target-bpw` chose: the written file's summary and each tensor's type (in file order; the
/// tensors left as they were included).
#[derive(Debug)]
pub struct TargetBpwReport {
    pub summary: Summary,
    pub types: Vec<(String, GgmlType)>,
    pub file_type: FileType,
}

/// Quantizes `input` into `output` with a type per tensor chosen for at most `target` bits per weight
/// (see the module documentation). Of `opts`, `keep`, `imatrix`, `token_embedding_type`,
/// `output_tensor_type`, `overwrite` and `progress` apply; `ftype` and `pure` do not.
pub fn quantize_file_to_bpw(
    input: &Path,
    output: &Path,
    target: f64,
    opts: &QuantizeOptions,
) -> anyhow::Result<TargetBpwReport> {
    quantize_file_to_bpw_sampled(input, output, target, opts, MAX_SAMPLE_ROWS)
}

/// [`quantize_file_to_bpw`] measuring at most `max_rows` rows per tensor (fewer is faster and coarser).
pub fn quantize_file_to_bpw_sampled(
    input: &Path,
    output: &Path,
    target: f64,
    opts: &QuantizeOptions,
    max_rows: usize,
) -> anyhow::Result<TargetBpwReport> {
    ensure!(
        target.is_finite() && target > 0.0,
        "--target-bpw must be a positive number of bits per weight, not {target}"
    );
    if same_file(input, output) {
        bail!("the output would overwrite the input {}", input.display());
    }
    let imatrix = match &opts.imatrix {
        Some(o) => o.load()?,
        None => None,
    };
    let f = GgufFile::open(input)?;
    let mut names: Vec<String> = f.tensors().iter().map(|t| t.name.clone()).collect();
    sort_like_llama_quantize(&mut names);
    let tied_output = !names.iter().any(|n| n == "output.weight");

    // Each tensor: a fixed type, or a target to measure.
    let mut fixed: Vec<Option<GgmlType>> = Vec::with_capacity(names.len());
    let mut targets = Vec::new();
    let mut target_of = Vec::with_capacity(names.len());
    let (mut n_elements, mut fixed_bits) = (0u64, 0u64);
    for name in &names {
        let info = f.tensor(name).expect("listed");
        n_elements += info.n_elements();
        let forced = match name.as_str() {
            "token_embd.weight" => opts.token_embedding_type,
            "output.weight" => opts.output_tensor_type,
            _ => None,
        };
        let kept = opts.keep.iter().any(|p| matches_pattern(name, p));
        let ty = if !is_quantizable(name, &info.ne) || kept {
            Some(info.ty)
        } else {
            forced
        };
        let weights = match (&imatrix, ty) {
            (Some(m), t) if t != Some(info.ty) => tensor_weights(m, name, &info.ne, false)?,
            _ => None,
        };
        if let Some(t) = ty {
            let bytes = t.row_bytes(info.ne[0]).with_context(|| {
                format!(
                    "tensor {name}: rows of {} are not whole {t} blocks",
                    info.ne[0]
                )
            })? * (info.n_elements() / info.ne[0].max(1));
            fixed_bits += bytes * 8;
            target_of.push(None);
        } else {
            target_of.push(Some(targets.len()));
            targets.push(Target {
                src: GgufTensor { file: &f, info },
                weights,
                types: candidate_types(name, info.ne[0], weights.is_some()),
            });
        }
        fixed.push(ty);
    }
    ensure!(n_elements > 0, "{} has no tensors", input.display());
    let budget_bits = (target * n_elements as f64).floor() as u64;
    let budget_left = budget_bits.checked_sub(fixed_bits);

    // Measure.
    let work: u64 = targets
        .iter()
        .map(|t| {
            sample_rows(t.src.n_rows() as usize, max_rows).len() as u64
                * t.src.row_len()
                * t.types.len() as u64
        })
        .sum();
    let bar = progress_bar(opts.progress, work);
    if opts.progress {
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {percent:>3}% measuring candidate types, ETA {eta:>4} {wide_msg}",
            )
            .expect("valid template"),
        );
    }
    let mut costs = Vec::with_capacity(targets.len());
    for t in &targets {
        bar.set_message(t.src.name().to_string());
        costs.push(measure(
            t,
            sensitivity(t.src.name(), tied_output),
            max_rows,
            &bar,
        )?);
    }
    bar.finish_and_clear();

    let min_bits: u64 = costs
        .iter()
        .map(|cs| cs.iter().map(|c| c.bits).min().expect("not empty"))
        .sum::<u64>()
        + fixed_bits;
    let fits = budget_left.is_some_and(|b| min_bits - fixed_bits <= b);
    if !fits {
        bail!(
            "--target-bpw {target} is below the smallest this file can be made: {:.4} bits per weight \
             (every quantizable tensor at its smallest type{})",
            min_bits as f64 / n_elements as f64,
            if imatrix.is_none() {
                "; an importance matrix (--imatrix) allows the 1- and 2-bit IQ types"
            } else {
                ""
            }
        );
    }
    let pick = allocate(&costs, budget_left.expect("fits"))?;

    // Write.
    let mut writer = GgufWriter::new();
    for (k, v) in f.metadata() {
        writer.set(k, v.to_owned_value());
    }
    let mut plan = Vec::with_capacity(names.len());
    let mut weights = Vec::with_capacity(names.len());
    let mut types = Vec::with_capacity(names.len());
    let mut quantized_types = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let info = f.tensor(name).expect("listed");
        let (ty, qw) = match target_of[i] {
            Some(ti) => (costs[ti][pick[ti]].ty, targets[ti].weights),
            None => {
                let ty = fixed[i].expect("fixed");
                let qw = match &imatrix {
                    Some(m) if ty != info.ty => tensor_weights(m, name, &info.ne, false)?,
                    _ => None,
                };
                (ty, qw)
            }
        };
        if ty.is_quantized() {
            quantized_types.push(ty);
        }
        plan.push(Planned {
            source: Box::new(GgufTensor { file: &f, info }),
            ty,
        });
        weights.push(qw);
        types.push((name.clone(), ty));
    }
    check_quantizers(&plan)?;
    let file_type = guessed_file_type(&quantized_types);
    set_last(
        &mut writer,
        "general.quantization_version",
        OwnedValue::U32(2),
    );
    set_last(
        &mut writer,
        "general.file_type",
        OwnedValue::U32(file_type.id()),
    );
    set_last(&mut writer, TARGET_BPW_KEY, OwnedValue::F32(target as f32));
    if let (Some(m), Some(o)) = (&imatrix, &opts.imatrix) {
        imatrix_metadata(&mut writer, m, &o.path);
    }
    let summary = write_gguf_weighted(
        output,
        writer,
        &plan,
        &weights,
        opts.overwrite,
        opts.progress,
    )?;
    ensure!(
        summary.bits_per_weight() <= target,
        "internal error: the file has {} bits per weight, more than the target {target}",
        summary.bits_per_weight()
    );
    Ok(TargetBpwReport {
        summary,
        types,
        file_type,
    })
}

/// The key recording the `--target-bpw` a file was made with.
pub const TARGET_BPW_KEY: &str = "quantize.target_bpw";

#[cfg(test)]
mod tests {
    use super::*;

    fn c(bits: u64, error: f64) -> Choice {
        Choice {
            ty: GgmlType::Q4_K,
            bits,
            error,
        }
    }

    /// Every combination: the least error within the budget.
    fn brute_force(tensors: &[Vec<Choice>], budget: u64) -> f64 {
        let mut best = f64::INFINITY;
        let mut idx = vec![0usize; tensors.len()];
        loop {
            if total_bits(tensors, &idx) <= budget {
                let e: f64 = tensors.iter().zip(&idx).map(|(cs, &i)| cs[i].error).sum();
                best = best.min(e);
            }
            let mut t = 0;
            loop {
                if t == tensors.len() {
                    return best;
                }
                idx[t] += 1;
                if idx[t] < tensors[t].len() {
                    break;
                }
                idx[t] = 0;
                t += 1;
            }
        }
    }

    fn error_of(tensors: &[Vec<Choice>], pick: &[usize]) -> f64 {
        tensors.iter().zip(pick).map(|(cs, &i)| cs[i].error).sum()
    }

    #[test]
    fn known_optimum() {
        // A sensitive tensor (big error drop per bit) and two dull ones: with 10 bits of headroom
        // over the smallest (30), the sensitive one takes both upgrades, the dull ones nothing.
        let t = vec![
            vec![c(10, 100.0), c(15, 20.0), c(20, 5.0)],
            vec![c(10, 10.0), c(15, 9.0), c(20, 8.5)],
            vec![c(10, 10.0), c(15, 8.0), c(20, 7.0)],
        ];
        let pick = allocate(&t, 40).unwrap();
        assert_eq!(pick, vec![2, 0, 0]);
        // 5 more bits: the third tensor's first upgrade (2 saved) beats the second's (1).
        let pick = allocate(&t, 45).unwrap();
        assert_eq!(pick, vec![2, 0, 1]);
        assert_eq!(allocate(&t, 1000).unwrap(), vec![2, 2, 2]);
        assert_eq!(allocate(&t, 30).unwrap(), vec![0, 0, 0]);
    }

    #[test]
    fn below_the_smallest_is_an_error() {
        let t = vec![vec![c(10, 1.0), c(20, 0.5)], vec![c(8, 1.0)]];
        let e = allocate(&t, 17).unwrap_err().to_string();
        assert!(e.contains("smallest"), "{e}");
        assert!(allocate(&[vec![]], 100).is_err());
    }

    /// Small pseudo-random problems: always within the budget and no better than the exhaustive
    /// optimum; exactly the optimum when the budget is a Lagrangian solution's size.
    #[test]
    fn the_exhaustive_optimum_at_lagrangian_budgets() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..200 {
            let n = 2 + (next() % 4) as usize;
            let tensors: Vec<Vec<Choice>> = (0..n)
                .map(|_| {
                    let size = 1 + next() % 50;
                    let scale = (next() % 1000) as f64 + 1.0;
                    [2u64, 3, 4, 5, 6, 8]
                        .iter()
                        .map(|&b| {
                            let jitter = 1.0 + (next() % 100) as f64 / 200.0;
                            c(b * size, scale * 0.25f64.powi(b as i32) * jitter)
                        })
                        .collect()
                })
                .collect();
            let min: u64 = tensors.iter().map(|cs| cs[0].bits).sum();
            let max: u64 = tensors.iter().map(|cs| cs[5].bits).sum();
            let budget = min + next() % (max - min + 1);
            let pick = allocate(&tensors, budget).unwrap();
            assert!(total_bits(&tensors, &pick) <= budget);
            assert!(error_of(&tensors, &pick) >= brute_force(&tensors, budget) - 1e-12);

            let lambda = 1e-3 * 1.5f64.powi((next() % 40) as i32);
            let budget = total_bits(&tensors, &pick_for_lambda(&tensors, lambda));
            let got = error_of(&tensors, &allocate(&tensors, budget).unwrap());
            let best = brute_force(&tensors, budget);
            assert!(got <= best * (1.0 + 1e-9) + 1e-12, "{got} > optimum {best}");
        }
    }

    #[test]
    fn total_bits_never_grow_with_lambda() {
        let t = vec![
            vec![c(10, 100.0), c(15, 20.0), c(20, 5.0), c(40, 4.0)],
            vec![c(10, 10.0), c(15, 9.0), c(20, 8.5)],
            vec![c(12, 10.0), c(13, 8.0), c(30, 1.0)],
        ];
        let mut last = u64::MAX;
        for i in 0..400 {
            let lambda = if i == 0 { 0.0 } else { 1e-6 * 1.05f64.powi(i) };
            let bits = total_bits(&t, &pick_for_lambda(&t, lambda));
            assert!(bits <= last, "λ {lambda}: {bits} > {last}");
            last = bits;
        }
        assert_eq!(last, 32, "a large λ takes the smallest of each");
    }

    #[test]
    fn candidates_respect_rows_and_weights() {
        let with = candidate_types("blk.0.ffn_up.weight", 256, true);
        assert!(with.contains(&GgmlType::IQ1_S) && with.contains(&GgmlType::Q4_K));
        let without = candidate_types("blk.0.ffn_up.weight", 256, false);
        assert!(!without.contains(&GgmlType::IQ2_XXS) && !without.contains(&GgmlType::IQ3_XXS));
        assert!(without.contains(&GgmlType::Q2_K) && without.contains(&GgmlType::IQ3_S));
        let emb = candidate_types("token_embd.weight", 256, false);
        assert!(emb.contains(&GgmlType::IQ2_S) && !emb.contains(&GgmlType::IQ2_XXS));
        let short = candidate_types("blk.0.ffn_up.weight", 96, true);
        assert!(short.iter().all(|t| t.block_size() == 32), "{short:?}");
        assert_eq!(candidate_types("x.weight", 7, true), vec![GgmlType::F16]);
    }

    #[test]
    fn file_type_of_the_most_used_type() {
        use GgmlType as T;
        assert_eq!(
            guessed_file_type(&[T::Q4_K, T::Q4_K, T::Q6_K]),
            FileType::Q4_K_M
        );
        assert_eq!(
            guessed_file_type(&[T::IQ2_S, T::IQ2_S, T::Q6_K]),
            FileType::IQ2_S
        );
        assert_eq!(guessed_file_type(&[T::IQ3_S]), FileType::IQ3_S);
    }
}
