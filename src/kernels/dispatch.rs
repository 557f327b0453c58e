//! The kernel table: chosen once from the CPU's features, overridable with `DELTAQ_ISA`.

use std::marker::PhantomData;
use std::sync::OnceLock;

use half::f16;

use super::attend::{AttendFn, AttendManyFn, BLOCK};
use crate::quant::GgmlType;

/// An instruction-set path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
    /// The AVX-512 table with AMX-INT8 tile products for the K-quant prefill GEMM.
    Amx,
    Neon,
    NeonDotprod,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "avx512-amx",
            Isa::Neon => "neon",
            Isa::NeonDotprod => "neon-dotprod",
        }
    }

    /// The AVX-512 tables (with or without AMX), which share every kernel but the prefill GEMM.
    pub fn is_avx512(self) -> bool {
        matches!(self, Isa::Avx512 | Isa::Amx)
    }

    pub fn from_name(s: &str) -> Option<Isa> {
        [
            Isa::Scalar,
            Isa::Avx2,
            Isa::Avx512,
            Isa::Amx,
            Isa::Neon,
            Isa::NeonDotprod,
        ]
        .into_iter()
        .find(|i| i.name().eq_ignore_ascii_case(s))
    }
}

/// One instruction set's kernels. All functions are safe to call: a table is only handed out on a CPU
/// that has the features its functions were compiled for.
#[derive(Clone, Copy)]
pub struct Kernels {
    pub isa: Isa,
    /// `out[r * n_tok + t] = W[r] · A[t]` for quantized weight rows `w` (`out.len() / n_tok` rows, back to
    /// back) of type `ty` and `n_tok` activation rows `a` already quantized to `ty.vec_dot_type()`.
    pub quant_rows: fn(ty: GgmlType, w: &[u8], a: &[u8], n_tok: usize, out: &mut [f32]),
    /// Prefill over whole panels of weight rows, where the table has such a kernel: `out[t * n_rows + r] =
    /// W[r] · A[t]` (token-major; otherwise as `quant_rows`), bit-identical to `quant_rows`.
    pub quant_gemm: Option<QuantGemm>,
    /// The same for F32/F16/BF16 weight rows and f32 activations (`n_tok` rows back to back).
    pub float_rows: fn(ty: GgmlType, w: &[u8], a: &[f32], n_tok: usize, out: &mut [f32]),
    /// Quantizes one activation row to Q8_0, Q8_1 or Q8_K: the same bytes as the reference quantizer.
    pub quantize_act: fn(ty: GgmlType, x: &[f32], out: &mut [u8]),
    /// One query's attention over an f32 KV cache ([`super::attend::attend`]).
    pub attend_f32: AttendFn<f32>,
    /// The same over an f16 KV cache (rows widened to f32 as they are read).
    pub attend_f16: AttendFn<f16>,
    /// Several queries over one KV head of an f32 cache ([`super::attend::attend_many`]).
    pub attend_many_f32: AttendManyFn<f32>,
    /// The same over an f16 cache.
    pub attend_many_f16: AttendManyFn<f16>,
    /// The weights and values steps of the grouped attention body over f32 rows, for the attention
    /// that computes its own scores (over Q8_0 / Q4_0 caches, [`super::attend_quant`]).
    pub attend_steps: AttendSteps,
    /// The element-wise and per-row ops of the model blocks ([`super::ops`]).
    pub ops: OpsFns,
}

/// The steps of [`super::attend::body_grouped`] that do not read keys, as a table serves them to an
/// attention over f32 value rows.
/// [`AttendSteps::values`]: `(out, w, v, stride, r)`.
pub type ValuesFn = fn(out: &mut [f32], w: &[[f32; BLOCK]], v: &[f32], stride: usize, r: usize);

#[derive(Clone, Copy)]
pub struct AttendSteps {
    /// `s ← e^{s − max}` in place, their sum added to the normalizer `sum`.
    pub weights: fn(s: &mut [f32], max: f32, sum: &mut f64),
    /// `out_j ← out_j + Σ_{i<r} w[j][i]·v[i·stride..][..hd]` for the `w.len()` (1 to 8) queries whose
    /// outputs are consecutive in `out` (`hd = out.len() / w.len()`), every element taking the rows in
    /// order with the same operations whatever the group size.
    pub values: ValuesFn,
}

/// A table's prefill GEMM ([`Kernels::quant_gemm`]) and the weight types it takes.
#[derive(Clone, Copy)]
pub struct QuantGemm {
    pub supports: fn(ty: GgmlType) -> bool,
    pub run: fn(ty: GgmlType, w: &[u8], a: &[u8], out: GemmOut<'_>),
    /// For the types it takes, the same with the Q8_K activations' quants also as plain rows
    /// ([`Q8kQuants`]), which a GEMM reading 64-byte rows of several tokens at once (AMX tiles) wants
    /// aligned; the same results.
    pub run_quants: Option<QuantsGemm>,
}

/// A prefill GEMM that also takes the activations' quants as aligned rows ([`QuantGemm::run_quants`]).
#[derive(Clone, Copy)]
pub struct QuantsGemm {
    pub supports: fn(ty: GgmlType) -> bool,
    pub run: fn(ty: GgmlType, w: &[u8], a: &[u8], qs: Q8kQuants<'_>, out: GemmOut<'_>),
}

/// The quants of Q8_K activation rows without the blocks' scales: token `t`'s `n_in` values at byte
/// `t · n_in`, in 64-byte aligned lines (`n_in` is a multiple of the block size, 256), and the blocks'
/// sums per 32 values (`sums32[t · n_in / 256 + b]` for block `b`; the sum of the two 16-value sums).
#[derive(Clone, Copy)]
pub struct Q8kQuants<'a> {
    pub lines: &'a [Line64],
    pub sums32: &'a [[i16; 8]],
    pub n_in: usize,
}

/// 64 bytes on a 64-byte boundary.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub struct Line64(pub [u8; 64]);

/// Where a prefill GEMM writes: `rows` results for each of `n_tok` tokens, token `t`'s at
/// `t * ld .. t * ld + rows`. The rows of one work item are a column block of the whole output, so the
/// block is described by a pointer and a stride rather than a slice (several threads write disjoint
/// column blocks of the same rows).
pub struct GemmOut<'a> {
    ptr: *mut f32,
    rows: usize,
    n_tok: usize,
    ld: usize,
    _out: PhantomData<&'a mut [f32]>,
}

impl<'a> GemmOut<'a> {
    /// A whole token-major `[n_tok × rows]` matrix.
    pub fn new(out: &'a mut [f32], n_tok: usize) -> GemmOut<'a> {
        let rows = out.len().checked_div(n_tok).unwrap_or(0);
        assert_eq!(rows * n_tok, out.len(), "output is not tokens × rows");
        GemmOut {
            ptr: out.as_mut_ptr(),
            rows,
            n_tok,
            ld: rows,
            _out: PhantomData,
        }
    }

    /// # Safety
    /// For every `t < n_tok` and `r < rows`, `ptr + t * ld + r` must be valid for writes during `'a`,
    /// and nothing else may access those elements meanwhile (`rows ≤ ld`).
    pub unsafe fn from_raw(ptr: *mut f32, rows: usize, n_tok: usize, ld: usize) -> GemmOut<'a> {
        assert!(rows <= ld || n_tok <= 1, "GemmOut: rows overlap");
        GemmOut {
            ptr,
            rows,
            n_tok,
            ld,
            _out: PhantomData,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn n_tok(&self) -> usize {
        self.n_tok
    }

    /// For weights `w` (`rows()` rows of `wb`-byte blocks) and activations `a` (`n_tok()` rows, as many
    /// `ab`-byte blocks each): the bytes per weight row and the blocks per row. Panics if the lengths
    /// do not fit together (a kernel reads nothing before this check).
    pub fn blocks(&self, w: &[u8], a: &[u8], wb: usize, ab: usize) -> (usize, usize) {
        let rb = w.len() / self.rows.max(1);
        let nb = rb / wb;
        assert!(
            rb * self.rows == w.len() && nb * wb == rb && a.len() == self.n_tok * nb * ab,
            "gemm: weight/activation lengths do not match"
        );
        (rb, nb)
    }

    /// Tokens `t0..t0 + n` of this output.
    pub fn tokens(&mut self, t0: usize, n: usize) -> GemmOut<'_> {
        assert!(t0 + n <= self.n_tok, "GemmOut: tokens out of range");
        GemmOut {
            ptr: self.ptr.wrapping_add(t0 * self.ld),
            rows: self.rows,
            n_tok: n,
            ld: self.ld,
            _out: PhantomData,
        }
    }

    /// Token `t`'s results (`t < n_tok`): `rows` writable floats.
    pub fn token_ptr(&mut self, t: usize) -> *mut f32 {
        assert!(t < self.n_tok, "GemmOut: token out of range");
        self.ptr.wrapping_add(t * self.ld)
    }
}

/// The element-wise ops, each over a whole slice. Every SIMD version equals the scalar `_ref` in
/// [`super::scalar`] up to the rounding of its `exp` (≤ 2 ulp) and the association of f64 sums.
#[derive(Clone, Copy)]
pub struct OpsFns {
    /// `x ← x · scale · w`, `scale = 1 / sqrt(mean(x²) + eps)` (the sum of squares in f64).
    pub rms_norm: fn(x: &mut [f32], w: &[f32], eps: f32),
    /// `x ← x / max(‖x‖₂, eps)` (the sum of squares in f64).
    pub l2_norm: fn(x: &mut [f32], eps: f32),
    /// In-place softmax: max-subtracted, the normalizer summed in f64.
    pub softmax: fn(x: &mut [f32]),
    /// `x ← eˣ`.
    pub exp: fn(x: &mut [f32]),
    /// `x ← σ(x) = 1 / (1 + e⁻ˣ)`.
    pub sigmoid: fn(x: &mut [f32]),
    /// `x ← silu(x) = x · σ(x)`.
    pub silu: fn(x: &mut [f32]),
    /// SwiGLU: `g ← silu(g) · u`.
    pub swiglu: fn(g: &mut [f32], u: &[f32]),
    /// `x ← x · silu(z)` (the gate of DeltaNet's gated norm).
    pub silu_mul: fn(x: &mut [f32], z: &[f32]),
    /// `x ← x · σ(g)` (the output gate of full attention).
    pub sigmoid_mul: fn(x: &mut [f32], g: &[f32]),
    /// NEOX RoPE with precomputed angles: for `i < h = cos.len()`, `(x[i], x[i+h])` is rotated by the
    /// angle whose cosine and sine are `cos[i]`, `sin[i]`; `x[2h..]` is left alone.
    pub rope: fn(x: &mut [f32], cos: &[f32], sin: &[f32]),
    /// One token of the delta rule on one head's state `m` (`[dv × dk]` row-major, row `j` = value dim
    /// `j`), with `q`, `k` `[dk]`, `v`, `out` `[dv]`: per row, `row ← decay·row`,
    /// `δ = β (v_j − row·k)`, `row ← row + δ k`, `out_j = row·q`. With `from`, the state before the
    /// step is read there instead and `m` only written (the same bits as copying it to `m` first).
    pub delta_step: DeltaStep,
    /// Causal depthwise conv + SiLU over rows (DeltaNet's qkv conv): with `C = taps.len() / kk`,
    /// `y[t][c] = silu(Σ_j taps[j][c] · x[t + j][c])` for every row `t` of `y` (`[T × C]`), `taps`
    /// `[kk × C]`, `x` `[(T + kk − 1) × C]`; the sum from 0 in tap order, multiplies and adds separate.
    pub conv_silu: fn(taps: &[f32], kk: usize, x: &[f32], y: &mut [f32]),
}

/// The signature of [`OpsFns::delta_step`]: `(from, m, q, k, v, decay, beta, out)`.
pub type DeltaStep = fn(Option<&[f32]>, &mut [f32], &[f32], &[f32], &[f32], f32, f32, &mut [f32]);

/// Every table this CPU can run, lowest first (always starts with scalar).
pub fn available() -> Vec<&'static Kernels> {
    let mut v: Vec<&'static Kernels> = vec![&super::scalar::KERNELS];
    #[cfg(target_arch = "x86_64")]
    v.extend(super_x86());
    #[cfg(target_arch = "aarch64")]
    v.extend(super_arm());
    v
}

#[cfg(target_arch = "x86_64")]
fn super_x86() -> Vec<&'static Kernels> {
    use super::x86::{avx2, avx512, kgemm_amx};
    let mut v: Vec<&'static Kernels> = Vec::new();
    if avx2::detected() {
        v.push(&avx2::KERNELS);
        if avx512::detected() {
            v.push(&avx512::KERNELS);
            if kgemm_amx::detected() {
                v.push(&avx512::KERNELS_AMX);
            }
        }
    }
    v
}

#[cfg(target_arch = "aarch64")]
fn super_arm() -> Vec<&'static Kernels> {
    super::arm::tables()
}

/// The table for `isa`, if this CPU runs it.
pub fn by_isa(isa: Isa) -> Option<&'static Kernels> {
    available().into_iter().find(|k| k.isa == isa)
}

/// The table every matmul uses: the best this CPU runs, or the one `DELTAQ_ISA` names (if available;
/// otherwise a warning and the best).
pub fn kernels() -> &'static Kernels {
    static CHOSEN: OnceLock<&'static Kernels> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let all = available();
        let best = *all.last().expect("scalar is always available");
        match std::env::var("DELTAQ_ISA") {
            Ok(name) => match Isa::from_name(&name).and_then(by_isa) {
                Some(k) => k,
                None => {
                    let names: Vec<&str> = all.iter().map(|k| k.isa.name()).collect();
                    eprintln!(
                        "warning: DELTAQ_ISA={name} is not available here (available: {}); using {}",
                        names.join(", "),
                        best.isa.name()
                    );
                    best
                }
            },
            Err(_) => best,
        }
    })
}
