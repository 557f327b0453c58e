//! The lattice formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) against the gguf package's dequantizer (vectors from
//! tools/make_iq_dequant_vectors.py), their dot products against the dequantized values, and their
//! quantizers' round trip.

use bytemuck::Zeroable;

use super::*;
use crate::quant::{BlockFormat, BlockQ8K, ImatrixQuantize, QK_K};

/// Blocks and expected values of a `dequant-<TYPE>.bin` vector file.
fn vector<B: BlockFormat>(bytes: &[u8]) -> (Vec<B>, Vec<f32>) {
    let size = std::mem::size_of::<B>();
    let n = bytes.len() / (size + 4 * QK_K);
    assert_eq!(n * (size + 4 * QK_K), bytes.len(), "vector file length");
    let blocks = bytes[..n * size]
        .chunks_exact(size)
        .map(bytemuck::pod_read_unaligned)
        .collect();
    let values = bytes[n * size..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (blocks, values)
}

fn check_dequant<B: BlockFormat>(bytes: &[u8]) {
    let (blocks, want) = vector::<B>(bytes);
    let mut got = vec![0f32; want.len()];
    B::dequantize(&blocks, &mut got);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{} value {i}: {g} vs {w}",
            B::TYPE
        );
    }
}

#[test]
fn dequantize_matches_gguf_package() {
    check_dequant::<BlockIQ2XXS>(include_bytes!(
        "../../../tests/fixtures/iq/dequant-IQ2_XXS.bin"
    ));
    check_dequant::<BlockIQ2XS>(include_bytes!(
        "../../../tests/fixtures/iq/dequant-IQ2_XS.bin"
    ));
    check_dequant::<BlockIQ2S>(include_bytes!(
        "../../../tests/fixtures/iq/dequant-IQ2_S.bin"
    ));
    check_dequant::<BlockIQ1S>(include_bytes!(
        "../../../tests/fixtures/iq/dequant-IQ1_S.bin"
    ));
    check_dequant::<BlockIQ1M>(include_bytes!(
        "../../../tests/fixtures/iq/dequant-IQ1_M.bin"
    ));
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `vec_dot_ref` against the f64 dot of the dequantized rows (the integer sums are exact; only the
/// float scaling differs).
fn check_dot<B: BlockFormat<VecDot = BlockQ8K>>(bytes: &[u8]) {
    let (w, wf) = vector::<B>(bytes);
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let x: Vec<f32> = (0..wf.len()).map(|_| rng.f()).collect();
    let mut a = vec![BlockQ8K::zeroed(); w.len()];
    BlockQ8K::quantize(&x, &mut a);
    let mut af = vec![0f32; x.len()];
    BlockQ8K::dequantize(&a, &mut af);
    for (i, (wb, ab)) in w.iter().zip(&a).enumerate() {
        let got = B::vec_dot_ref(std::slice::from_ref(wb), std::slice::from_ref(ab)) as f64;
        let r = QK_K * i..QK_K * (i + 1);
        let want: f64 = wf[r.clone()]
            .iter()
            .zip(&af[r.clone()])
            .map(|(&p, &q)| p as f64 * q as f64)
            .sum();
        let mag: f64 = wf[r.clone()]
            .iter()
            .zip(&af[r])
            .map(|(&p, &q)| (p as f64 * q as f64).abs())
            .sum();
        assert!(
            (got - want).abs() <= 1e-5 * mag + 1e-30,
            "{} block {i}: {got} vs {want}",
            B::TYPE
        );
    }
}

#[test]
fn vec_dot_matches_dequantized_dot() {
    check_dot::<BlockIQ2XXS>(include_bytes!(
        "../../../tests/fixtures/iq/dequant-IQ2_XXS.bin"
    ));
    check_dot::<BlockIQ2XS>(include_bytes!(
        "../../../tests/fixtures/iq/dequant-IQ2_XS.bin"
    ));
    check_dot::<BlockIQ2S>(include_bytes!(
        "../../../tests/fixtures/iq/dequant-IQ2_S.bin"
    ));
    check_dot::<BlockIQ1S>(include_bytes!(
        "../../../tests/fixtures/iq/dequant-IQ1_S.bin"
    ));
    check_dot::<BlockIQ1M>(include_bytes!(
        "../../../tests/fixtures/iq/dequant-IQ1_M.bin"
    ));
}

/// Quantize then dequantize Gaussian-like rows: the relative RMS error of a 2-bit lattice code.
fn round_trip<B: ImatrixQuantize>(weights: bool) -> f64 {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let n = 8 * QK_K;
    let x: Vec<f32> = (0..n)
        .map(|_| (0..4).map(|_| rng.f()).sum::<f32>())
        .collect();
    let qw: Vec<f32> = (0..n).map(|_| 0.5 + rng.f().abs()).collect();
    let mut q = vec![B::zeroed(); n / QK_K];
    B::quantize_row_imatrix(&x, weights.then_some(&qw[..]), &mut q);
    let mut y = vec![0f32; n];
    B::dequantize(&q, &mut y);
    let err: f64 = x
        .iter()
        .zip(&y)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let norm: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
    (err / norm).sqrt()
}

#[test]
fn quantizers_round_trip() {
    for (ty, e) in [
        ("IQ2_XXS", round_trip::<BlockIQ2XXS>(true)),
        ("IQ2_XXS unit", round_trip::<BlockIQ2XXS>(false)),
        ("IQ2_XS", round_trip::<BlockIQ2XS>(true)),
        ("IQ2_XS unit", round_trip::<BlockIQ2XS>(false)),
        ("IQ2_S", round_trip::<BlockIQ2S>(true)),
        ("IQ2_S ref", round_trip::<BlockIQ2S>(false)),
        ("IQ1_S", round_trip::<BlockIQ1S>(true)),
        ("IQ1_S unit", round_trip::<BlockIQ1S>(false)),
        ("IQ1_M", round_trip::<BlockIQ1M>(true)),
        ("IQ1_M x²", round_trip::<BlockIQ1M>(false)),
    ] {
        eprintln!("{ty}: relative RMS error {e:.4}");
        assert!(e < 0.7, "{ty}: relative RMS error {e}");
    }
    // All-zero rows give zero blocks.
    let mut q = [BlockIQ2XXS::zeroed()];
    BlockIQ2XXS::quantize(&[0.0; QK_K], &mut q);
    assert!(q[0].d == 0 && q[0].qs.iter().all(|&v| v == 0));
}

/// ggml's weightless quantizer on 4 rows of 512 (tools/make_iq_ref_vectors.py): the same bytes.
fn check_ref_quantize<B: BlockFormat>(bytes: &[u8]) {
    let n = 4 * 512;
    let x: Vec<f32> = bytes[..4 * n]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut q = vec![B::zeroed(); n / QK_K];
    B::quantize(&x, &mut q);
    let got: &[u8] = bytemuck::cast_slice(&q);
    assert_eq!(got, &bytes[4 * n..], "{}", B::TYPE);
}

#[test]
fn weightless_quantizers_match_ggml() {
    check_ref_quantize::<BlockIQ2S>(include_bytes!("../../../tests/fixtures/iq/ref-IQ2_S.bin"));
    check_ref_quantize::<BlockIQ1M>(include_bytes!("../../../tests/fixtures/iq/ref-IQ1_M.bin"));
}
