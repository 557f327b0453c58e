//! `out = x · Wᵀ` for a GGUF weight matrix in any supported type, activations in f32.
//!
//! A weight with `ne = {n_in, n_out}` is `n_out` rows of `n_in` elements. Float weights (F32/F16/BF16) are
//! dotted with the f32 activations directly. Quantized weights follow ggml: each activation row is quantized
//! once to the weight type's `vec_dot_type` (Q8_0, Q8_1 or Q8_K), then every weight row is dotted with it
//! block by block. Work is split over output rows; a weight row is read once and used for every token.

use rayon::prelude::*;

use super::kernels;
use crate::quant::GgmlType;

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
    assert_eq!(x.len(), n_tokens * w.n_in, "{}: activation length", w.name);
    assert_eq!(out.len(), n_tokens * w.n_out, "{}: output length", w.name);
    let k = kernels();
    let row_bytes = w.row_bytes();
    if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        rows(w, n_tokens, out, |first, o| {
            let n = o.len() / n_tokens;
            (k.float_rows)(
                w.ty,
                &w.data[first * row_bytes..(first + n) * row_bytes],
                x,
                n_tokens,
                o,
            )
        });
        return;
    }
    // Quantize every activation row once; all weight rows reuse it.
    let act = w.ty.vec_dot_type();
    let act_bytes = act
        .row_bytes(w.n_in as u64)
        .expect("row length checked at load") as usize;
    let mut q = vec![0u8; n_tokens * act_bytes];
    q.par_chunks_mut(act_bytes)
        .zip(x.par_chunks(w.n_in))
        .for_each(|(q, x)| (k.quantize_act)(act, x, q));
    rows(w, n_tokens, out, |first, o| {
        let n = o.len() / n_tokens;
        (k.quant_rows)(
            w.ty,
            &w.data[first * row_bytes..(first + n) * row_bytes],
            &q,
            n_tokens,
            o,
        )
    });
}

/// Runs `f(first_row, out[rows × n_tokens])` over groups of weight rows in parallel, then scatters the
/// row-major results into the token-major `out`.
fn rows(w: &Weight, n_tokens: usize, out: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync) {
    // Rows per task: enough work per task to amortize scheduling, enough tasks to balance.
    let per_task = (16384 / (w.n_in * n_tokens).max(1)).clamp(4, 256);
    if n_tokens == 1 {
        out.par_chunks_mut(per_task)
            .enumerate()
            .for_each(|(i, o)| f(i * per_task, o));
        return;
    }
    let mut tmp = vec![0f32; w.n_out * n_tokens];
    tmp.par_chunks_mut(per_task * n_tokens)
        .enumerate()
        .for_each(|(i, o)| f(i * per_task, o));
    for (r, col) in tmp.chunks_exact(n_tokens).enumerate() {
        for (t, v) in col.iter().enumerate() {
            out[t * w.n_out + r] = *v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant;

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
