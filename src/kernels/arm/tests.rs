//! Every NEON table this CPU runs against the scalar reference: random, quantizer-made and edge-case
//! blocks, odd row counts, 1..=4 activation rows; exact equality where every partial sum is an exact
//! integer, 1e-5 of Σ|w·a| otherwise; byte equality for the activation quantizers.

use super::*;
use crate::kernels::scalar;
use crate::quant::{self, f16_from_f32};

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
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Byte offsets of the f16 scale fields in a weight or activation block.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::IQ3_XXS | GgmlType::IQ3_S => &[0],
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::TQ1_0 => &[52],
        GgmlType::TQ2_0 => &[64],
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ1_S => &[0],
        _ => &[],
    }
}

fn set_f16(block: &mut [u8], ty: GgmlType, f: &mut impl FnMut() -> u16) {
    for &o in f16_fields(ty) {
        block[o..o + 2].copy_from_slice(&f().to_le_bytes());
    }
    if ty == GgmlType::IQ1_M {
        // The f16 super-scale's nibble k is the top nibble of the u16 scale word k.
        let h = f();
        for k in 0..4 {
            let b = &mut block[48 + 2 * k + 1];
            *b = (*b & 0x0F) | (((h >> (4 * k)) & 0xF) << 4) as u8;
        }
    }
}

/// The tables under test (everything NEON this CPU runs).
fn neon_tables() -> Vec<&'static Kernels> {
    let t = tables();
    eprintln!(
        "testing: {}",
        t.iter()
            .map(|k| k.isa.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    t
}

/// Weight rows of `nb` blocks in one of several styles.
fn weight_rows(rng: &mut Rng, ty: GgmlType, n_rows: usize, nb: usize, style: usize) -> Vec<u8> {
    let n = nb * ty.block_size();
    let rb = ty.row_bytes(n as u64).unwrap() as usize;
    let mut w = vec![0u8; rb * n_rows];
    for row in w.chunks_exact_mut(rb) {
        match style {
            // The reference quantizer on random data of a random magnitude.
            0 => {
                let scale = [1e-3f32, 0.5, 40.0][rng.below(3) as usize];
                let x: Vec<f32> = (0..n).map(|_| rng.unit() * scale).collect();
                quant::quantize_row(ty, &x, row).unwrap();
            }
            // Random bytes with finite, moderate scales of either sign.
            1 => {
                row.copy_from_slice(&rng.bytes(rb));
                let mut f = || f16_from_f32(rng.unit() * 2.0);
                for b in row.chunks_exact_mut(ty.type_size()) {
                    set_f16(b, ty, &mut f);
                }
            }
            // Extremes: every quant bit set, largest finite scales.
            2 => {
                row.fill(0xFF);
                for b in row.chunks_exact_mut(ty.type_size()) {
                    set_f16(b, ty, &mut || 0x7BFF);
                }
            }
            // Extremes: all quant bits clear, smallest subnormal scales.
            _ => {
                row.fill(0);
                for b in row.chunks_exact_mut(ty.type_size()) {
                    set_f16(b, ty, &mut || 0x0001);
                }
            }
        }
        if ty == GgmlType::MXFP4 && style != 0 {
            // E8M0 scales 2^-28 .. 2^11, clear of the f32 overflow of the largest bytes.
            for b in row.chunks_exact_mut(ty.type_size()) {
                b[0] = 100 + rng.below(40) as u8;
            }
        }
    }
    w
}

/// Activation rows in `act` format: reference-quantized random data (with an all-zero block, a block of
/// ±max values), or for Q8_0/Q8_1 also raw random quants (including −128).
fn act_rows(rng: &mut Rng, act: GgmlType, n_tok: usize, nb_w: usize, wty: GgmlType) -> Vec<u8> {
    let n = nb_w * wty.block_size();
    let ab = act.row_bytes(n as u64).unwrap() as usize;
    let mut a = vec![0u8; ab * n_tok];
    for (t, row) in a.chunks_exact_mut(ab).enumerate() {
        let raw = act != GgmlType::Q8_K && t % 2 == 1;
        if raw {
            row.copy_from_slice(&rng.bytes(ab));
            let mut f = || f16_from_f32(rng.unit() * 0.1);
            for b in row.chunks_exact_mut(act.type_size()) {
                set_f16(b, act, &mut f);
            }
            continue;
        }
        let scale = [1e-2f32, 1.0, 300.0][rng.below(3) as usize];
        let mut x: Vec<f32> = (0..n).map(|_| rng.unit() * scale).collect();
        let bs = act.block_size();
        if n >= 2 * bs {
            x[..bs].fill(0.0);
            for (i, v) in x[bs..2 * bs].iter_mut().enumerate() {
                *v = if i % 3 == 0 { -scale } else { scale };
            }
        }
        quant::quantize_row(act, &x, row).unwrap();
    }
    a
}

/// Σ|w·a| over a row pair (dequantized), plus the Q8_1 min terms |m·s|: the scale of rounding error.
fn magnitude(ty: GgmlType, w: &[u8], a: &[u8]) -> f64 {
    let act = ty.vec_dot_type();
    let n = w.len() / ty.type_size() * ty.block_size();
    let (mut wf, mut af) = (vec![0f32; n], vec![0f32; n]);
    quant::dequantize_row(ty, w, &mut wf).unwrap();
    quant::dequantize_row(act, a, &mut af).unwrap();
    let mut m: f64 = wf
        .iter()
        .zip(&af)
        .map(|(x, y)| (*x as f64 * *y as f64).abs())
        .sum();
    if act == GgmlType::Q8_1 {
        for (wb, ab) in w
            .chunks_exact(ty.type_size())
            .zip(a.chunks_exact(act.type_size()))
        {
            let h = |b: &[u8], o: usize| quant::f32_from_f16(u16::from_le_bytes([b[o], b[o + 1]]));
            m += (h(wb, 2) as f64 * h(ab, 2) as f64).abs();
        }
    }
    m
}

fn check_quant(k: &Kernels, ty: GgmlType, w: &[u8], a: &[u8], n_tok: usize, what: &str) {
    let n_rows = w.len() / (a.len() / n_tok / ty.vec_dot_type().type_size() * ty.type_size());
    let mut want = vec![0f32; n_rows * n_tok];
    let mut got = vec![f32::NAN; n_rows * n_tok];
    (scalar::KERNELS.quant_rows)(ty, w, a, n_tok, &mut want);
    (k.quant_rows)(ty, w, a, n_tok, &mut got);
    let (rb, ab) = (w.len() / n_rows, a.len() / n_tok);
    for r in 0..n_rows {
        for t in 0..n_tok {
            let (g, e) = (got[r * n_tok + t], want[r * n_tok + t]);
            let mag = magnitude(ty, &w[r * rb..(r + 1) * rb], &a[t * ab..(t + 1) * ab]);
            let tol = 1e-5 * mag;
            assert!(
                (g as f64 - e as f64).abs() <= tol,
                "{} {ty} {what}: row {r}/{n_rows} tok {t}/{n_tok}: {g} vs scalar {e} (Σ|w·a| {mag})",
                k.isa.name()
            );
        }
    }
}

#[test]
fn quant_rows_match_scalar() {
    let tables = neon_tables();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for ty in QUANT_TYPES {
        let act = ty.vec_dot_type();
        for (nb, n_rows) in [(1, 1), (2, 3), (3, 4), (1, 5), (4, 7), (2, 9), (9, 6)] {
            for n_tok in 1..=4 {
                for style in 0..4 {
                    let w = weight_rows(&mut rng, ty, n_rows, nb, style);
                    let a = act_rows(&mut rng, act, n_tok, nb, ty);
                    for k in &tables {
                        check_quant(k, ty, &w, &a, n_tok, &format!("style {style} nb {nb}"));
                    }
                }
            }
        }
    }
}

/// Unit scales and small activations: every partial sum is an integer below 2^24, so any association
/// gives the exact result, and the kernels must agree with scalar (and with the f64 dot) bit for bit.
#[test]
fn quant_rows_exact_on_integer_data() {
    let tables = neon_tables();
    let mut rng = Rng(42);
    for ty in QUANT_TYPES {
        let act = ty.vec_dot_type();
        let (nb, n_rows, n_tok) = (2, 5, 3);
        let n = nb * ty.block_size();
        let mut w = weight_rows(&mut rng, ty, n_rows, nb, 1);
        for b in w.chunks_exact_mut(ty.type_size()) {
            set_f16(b, ty, &mut || 0x3C00);
            if ty == GgmlType::MXFP4 {
                b[0] = 128; // E8M0 half-scale 1: the doubled E2M1 levels as they are
            }
        }
        let ab = act.row_bytes(n as u64).unwrap() as usize;
        let mut a = vec![0u8; ab * n_tok];
        for blk in a.chunks_exact_mut(act.type_size()) {
            let qs: Vec<i8> = (0..act.block_size())
                .map(|_| rng.below(7) as i8 - 3)
                .collect();
            let sum: i32 = qs.iter().map(|&q| q as i32).sum();
            match act {
                GgmlType::Q8_0 => {
                    blk[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
                    blk[2..].copy_from_slice(bytemuck::cast_slice(&qs));
                }
                GgmlType::Q8_1 => {
                    blk[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
                    blk[2..4].copy_from_slice(&f16_from_f32(sum as f32).to_le_bytes());
                    blk[4..].copy_from_slice(bytemuck::cast_slice(&qs));
                }
                _ => {
                    blk[..4].copy_from_slice(&1f32.to_le_bytes());
                    blk[4..260].copy_from_slice(bytemuck::cast_slice(&qs));
                    for j in 0..16 {
                        let s: i32 = qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
                        blk[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
                    }
                }
            }
        }
        let mut want = vec![0f32; n_rows * n_tok];
        (scalar::KERNELS.quant_rows)(ty, &w, &a, n_tok, &mut want);
        let rb = w.len() / n_rows;
        for r in 0..n_rows {
            for t in 0..n_tok {
                let (mut wf, mut af) = (vec![0f32; n], vec![0f32; n]);
                quant::dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut wf).unwrap();
                quant::dequantize_row(act, &a[t * ab..(t + 1) * ab], &mut af).unwrap();
                let exact: f64 = wf.iter().zip(&af).map(|(x, y)| *x as f64 * *y as f64).sum();
                assert!(exact.abs() < (1 << 24) as f64);
                assert_eq!(want[r * n_tok + t] as f64, exact, "scalar {ty} r {r} t {t}");
            }
        }
        for k in &tables {
            let mut got = vec![0f32; n_rows * n_tok];
            (k.quant_rows)(ty, &w, &a, n_tok, &mut got);
            assert_eq!(got, want, "{} {ty}", k.isa.name());
        }
    }
}

/// Raw Q8_K blocks: random quants over the whole i8 range (−128 included), random `bsums` (the
/// kernels must take them as the reference does, not recompute them) and a random scale.
fn raw_q8k(rng: &mut Rng, row: &mut [u8]) {
    for blk in row.chunks_exact_mut(GgmlType::Q8_K.type_size()) {
        blk.copy_from_slice(&rng.bytes(blk.len()));
        blk[..4].copy_from_slice(&(rng.unit() * 0.01).to_le_bytes());
        blk[4 + rng.below(256) as usize] = 0x80;
    }
}

/// The lattice formats' kernels (IQ3, IQ2, IQ1) reproduce the scalar reference bit for bit: their
/// integer sums are exact, and their float steps are the reference's in its order. Quantizer-made,
/// random and extreme blocks, odd row counts, 1..=5 tokens, reference-quantized and raw activations.
#[test]
fn iq_lattice_rows_bit_identical() {
    const TYPES: [GgmlType; 7] = [
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
    ];
    let tables = neon_tables();
    let mut rng = Rng(0x5EED_1A77);
    for ty in TYPES {
        for (nb, n_rows) in [(1, 1), (2, 3), (1, 5), (3, 7), (2, 9)] {
            for n_tok in [1, 2, 3, 5] {
                for style in 0..4 {
                    let w = weight_rows(&mut rng, ty, n_rows, nb, style);
                    let mut a = act_rows(&mut rng, GgmlType::Q8_K, n_tok, nb, ty);
                    let ab = a.len() / n_tok;
                    for t in (1..n_tok).step_by(2) {
                        raw_q8k(&mut rng, &mut a[t * ab..(t + 1) * ab]);
                    }
                    let mut want = vec![0f32; n_rows * n_tok];
                    (scalar::KERNELS.quant_rows)(ty, &w, &a, n_tok, &mut want);
                    for k in &tables {
                        let mut got = vec![0f32; n_rows * n_tok];
                        (k.quant_rows)(ty, &w, &a, n_tok, &mut got);
                        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                            assert!(
                                g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()),
                                "{} {ty} style {style} nb {nb}: row {}/{n_rows} tok {}/{n_tok}: \
                                 {g:e} vs scalar {e:e}",
                                k.isa.name(),
                                i / n_tok,
                                i % n_tok
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn float_rows_match_scalar() {
    let tables = neon_tables();
    let mut rng = Rng(7);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for (n, n_rows) in [(1, 1), (7, 3), (8, 4), (19, 5), (64, 9), (259, 6)] {
            for n_tok in 1..=4 {
                let x: Vec<f32> = (0..n * n_rows).map(|_| rng.unit() * 3.0).collect();
                // One byte of padding in front: weight rows need not be aligned.
                let mut w = vec![0u8; 1 + n * n_rows * ty.type_size()];
                quant::quantize_row(ty, &x, &mut w[1..]).unwrap();
                let w = &w[1..];
                let a: Vec<f32> = (0..n * n_tok).map(|_| rng.unit()).collect();
                let mut want = vec![0f32; n_rows * n_tok];
                (scalar::KERNELS.float_rows)(ty, w, &a, n_tok, &mut want);
                let mut wf = vec![0f32; n * n_rows];
                quant::dequantize_row(ty, w, &mut wf).unwrap();
                for k in &tables {
                    let mut got = vec![0f32; n_rows * n_tok];
                    (k.float_rows)(ty, w, &a, n_tok, &mut got);
                    for r in 0..n_rows {
                        for t in 0..n_tok {
                            let mag: f64 = (0..n)
                                .map(|i| (wf[r * n + i] as f64 * a[t * n + i] as f64).abs())
                                .sum();
                            let (g, e) = (got[r * n_tok + t], want[r * n_tok + t]);
                            assert!(
                                (g as f64 - e as f64).abs() <= 1e-5 * mag,
                                "{} {ty} n {n} row {r} tok {t}: {g} vs {e}",
                                k.isa.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Inputs that probe the quantizers' rounding and special cases, 256 values (one Q8_K block).
fn quantizer_inputs(rng: &mut Rng) -> Vec<Vec<f32>> {
    let mut cases = Vec::new();
    for scale in [1e-6f32, 1.0, 1e4] {
        cases.push((0..256).map(|_| rng.unit() * scale).collect::<Vec<f32>>());
    }
    // Ties: amax 127 gives d = 1 (Q8_0) and iscale = ±1 (Q8_K), so halves are exact ties.
    let mut ties: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) * 0.5).collect();
    for b in ties.chunks_exact_mut(32) {
        b[31] = 127.0;
    }
    ties[0] = -127.0; // Q8_K: the first largest magnitude is negative
    cases.push(ties.clone());
    for v in ties.iter_mut() {
        *v = -*v;
    }
    cases.push(ties);
    // First largest magnitude decides the sign of the Q8_K scale: +a before −a.
    let mut pm: Vec<f32> = (0..256).map(|i| (i % 17) as f32 - 8.0).collect();
    pm[3] = 9.0;
    pm[200] = -9.0;
    cases.push(pm);
    cases.push(near_ties());
    cases.push(vec![0.0; 256]);
    cases.push(vec![-0.0; 256]);
    // Tiny (the reciprocal scale overflows), subnormal, huge, infinite and NaN inputs.
    for special in [
        1e-38f32,
        1e-40,
        3e38,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ] {
        let mut x: Vec<f32> = (0..256).map(|_| rng.unit() * 1e-39).collect();
        for i in [5, 37, 100, 255] {
            x[i] = special;
        }
        cases.push(x);
    }
    cases
}

/// Q8_0/Q8_1 blocks of values just beside rounding ties where ggml's multiplier `1/(amax/127)` and
/// `127/amax` (another plausible one) round differently: only the reference's exact recipe passes.
fn near_ties() -> Vec<f32> {
    let mut out = Vec::with_capacity(256);
    let mut amax = 1.0f32;
    while out.len() < 256 {
        amax = f32::from_bits(amax.to_bits() + 7919);
        let id = 1.0 / (amax / 127.0);
        let other = 127.0 / amax;
        if id == other {
            continue;
        }
        let mut block = vec![amax];
        for k in 0..127 {
            let tie = (k as f32 + 0.5) / id;
            for delta in -2i32..=2 {
                let x = f32::from_bits(tie.to_bits().wrapping_add_signed(delta));
                if block.len() < 32 && x < amax && (x * id).round() != (x * other).round() {
                    block.push(if k % 2 == 0 { x } else { -x });
                }
            }
        }
        if block.len() >= 4 {
            block.resize(32, 0.0);
            out.extend(block);
        }
    }
    out
}

#[test]
fn quantize_act_matches_reference_bytes() {
    let tables = neon_tables();
    let mut rng = Rng(1234);
    let cases = quantizer_inputs(&mut rng);
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        for (i, x) in cases.iter().enumerate() {
            // Also a two-block-row concatenation of neighbouring cases.
            let mut long = x.clone();
            long.extend(&cases[(i + 1) % cases.len()]);
            for x in [x, &long] {
                let bytes = ty.row_bytes(x.len() as u64).unwrap() as usize;
                let mut want = vec![0u8; bytes];
                (scalar::KERNELS.quantize_act)(ty, x, &mut want);
                for k in &tables {
                    let mut got = vec![0xAAu8; bytes];
                    (k.quantize_act)(ty, x, &mut got);
                    assert!(got == want, "{} {ty} case {i}", k.isa.name());
                }
            }
        }
    }
}

/// The dispatcher offers every NEON table this CPU runs. Under emulation the test script sets
/// `DELTAQ_TEST_EXPECT_DOTPROD` to 1 (Cortex-A76) or 0 (Cortex-A53), so a CPU model that does not
/// report what it should fails here instead of silently skipping the sdot kernels.
#[test]
fn tables_follow_cpu_features() {
    let names: Vec<Isa> = crate::kernels::available().iter().map(|k| k.isa).collect();
    assert!(names.contains(&Isa::Scalar) && names.contains(&Isa::Neon));
    assert_eq!(names.contains(&Isa::NeonDotprod), has_dotprod());
    if let Ok(v) = std::env::var("DELTAQ_TEST_EXPECT_DOTPROD") {
        assert_eq!(
            has_dotprod(),
            v == "1",
            "dotprod detection vs DELTAQ_TEST_EXPECT_DOTPROD={v}"
        );
    }
}
