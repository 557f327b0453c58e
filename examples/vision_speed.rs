//! Time of the vision tower per image on a synthetic full-size mmproj:
//! `cargo run --release --example vision_speed -- [0.8b|9b] [TYPE] [THREADS] [REPS]`.
//!
//! Writes an mmproj GGUF with the Qwen3.5 tower's tensor names, metadata and shapes (0.8b: depth 12,
//! width 768, 12 heads, FFN 3072, output 1024; 9b: depth 27, width 1152, 16 heads, FFN 4304, output
//! 4096) and random weights of unit-activation scale (bf16 values, as in the released checkpoints), matrices in TYPE (f16 by default, as
//! `convert_hf_to_gguf.py --mmproj` writes them; f32, bf16, q8_0, ...; a matrix whose rows the type's
//! blocks do not divide stays F16, as llama-quantize falls back), norms, biases and the position table
//! F32. Then encodes an image of GRID patches (env `GRID=HxW`, default 48x64: a 1024 × 768 image, 768
//! merged tokens) REPS times (default 3, after one warm-up) on THREADS threads (default 2) and prints
//! the seconds per image. `KEEP=path` keeps the mmproj file there.

use std::time::Instant;

use deltaq::gguf::{GgufWriter, OwnedValue, TensorSpec, ValueType};
use deltaq::kernels::bf16_gemm::bf16_rne;
use deltaq::quant::{self, GgmlType};
use deltaq::vision::mmproj;
use deltaq::vision::tower::{VisionModel, VisionScratch};

/// Tower shape: depth, width, heads, FFN, output (the text model's width).
struct Shape {
    depth: usize,
    width: usize,
    heads: usize,
    ffn: usize,
    out: usize,
}

fn shape(size: &str) -> Shape {
    match size {
        "0.8b" => Shape {
            depth: 12,
            width: 768,
            heads: 12,
            ffn: 3072,
            out: 1024,
        },
        "9b" => Shape {
            depth: 27,
            width: 1152,
            heads: 16,
            ffn: 4304,
            out: 4096,
        },
        other => panic!("unknown size '{other}' (0.8b or 9b)"),
    }
}

const PATCH: u64 = 16;
const POS_SIDE: u64 = 48;

/// How a tensor's values are drawn: uniform with this standard deviation around this mean.
#[derive(Clone, Copy)]
struct Init {
    mean: f32,
    std: f32,
}

/// Uniform pseudo-random values of a given mean and standard deviation (an LCG: fast, reproducible).
struct Rng(u64);
impl Rng {
    fn next(&mut self, init: Init) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let u = (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5; // std 1/√12
        init.mean + u * init.std * 12f32.sqrt()
    }
}

fn write_mmproj(path: &std::path::Path, s: &Shape, ty: GgmlType) -> anyhow::Result<()> {
    let (d, ff, m4) = (s.width as u64, s.ffn as u64, 4 * s.width as u64);
    let mut w = GgufWriter::new();
    let u32v = |v: u64| OwnedValue::U32(v as u32);
    w.set("general.architecture", OwnedValue::str("clip"));
    w.set("general.type", OwnedValue::str("mmproj"));
    w.set(
        "general.name",
        OwnedValue::str("synthetic Qwen3.5 vision tower"),
    );
    w.set("clip.has_vision_encoder", OwnedValue::Bool(true));
    w.set("clip.projector_type", OwnedValue::str("qwen3vl_merger"));
    w.set("clip.use_gelu", OwnedValue::Bool(true));
    w.set("clip.vision.projection_dim", u32v(s.out as u64));
    w.set("clip.vision.image_size", u32v(POS_SIDE * PATCH));
    w.set("clip.vision.patch_size", u32v(PATCH));
    w.set("clip.vision.embedding_length", u32v(d));
    w.set("clip.vision.feed_forward_length", u32v(ff));
    w.set("clip.vision.block_count", u32v(s.depth as u64));
    w.set("clip.vision.attention.head_count", u32v(s.heads as u64));
    w.set("clip.vision.spatial_merge_size", u32v(2));
    w.set(
        "clip.vision.attention.layer_norm_epsilon",
        OwnedValue::F32(1e-6),
    );
    let half = OwnedValue::Array(ValueType::F32, vec![OwnedValue::F32(0.5); 3]);
    w.set("clip.vision.image_mean", half.clone());
    w.set("clip.vision.image_std", half);

    // (name, ne, matrix?, init)
    let mut tensors: Vec<(String, Vec<u64>, bool, Init)> = Vec::new();
    let mat = |n_in: u64, gain: f32| Init {
        mean: 0.0,
        std: gain / (n_in as f32).sqrt(),
    };
    let norm = Init {
        mean: 1.0,
        std: 0.1,
    };
    let bias = Init {
        mean: 0.0,
        std: 0.05,
    };
    for il in 0..s.depth {
        let n = |t: &str| format!("v.blk.{il}.{t}");
        tensors.extend([
            (n("attn_qkv.weight"), vec![d, 3 * d], true, mat(d, 1.5)),
            (n("attn_qkv.bias"), vec![3 * d], false, bias),
            (n("attn_out.weight"), vec![d, d], true, mat(d, 0.7)),
            (n("attn_out.bias"), vec![d], false, bias),
            (n("ln1.weight"), vec![d], false, norm),
            (n("ln1.bias"), vec![d], false, bias),
            (n("ln2.weight"), vec![d], false, norm),
            (n("ln2.bias"), vec![d], false, bias),
            (n("ffn_up.weight"), vec![d, ff], true, mat(d, 1.0)),
            (n("ffn_up.bias"), vec![ff], false, bias),
            (n("ffn_down.weight"), vec![ff, d], true, mat(ff, 0.7)),
            (n("ffn_down.bias"), vec![d], false, bias),
        ]);
    }
    let conv = mat(3 * 2 * PATCH * PATCH, 1.5);
    tensors.extend([
        (
            "v.patch_embd.weight".into(),
            vec![PATCH, PATCH, 3, d],
            true,
            conv,
        ),
        (
            "v.patch_embd.weight.1".into(),
            vec![PATCH, PATCH, 3, d],
            true,
            conv,
        ),
        ("v.patch_embd.bias".into(), vec![d], false, bias),
        (
            "v.position_embd.weight".into(),
            vec![d, POS_SIDE * POS_SIDE],
            false,
            Init {
                mean: 0.0,
                std: 0.5,
            },
        ),
        ("v.post_ln.weight".into(), vec![d], false, norm),
        ("v.post_ln.bias".into(), vec![d], false, bias),
        ("mm.0.weight".into(), vec![m4, m4], true, mat(m4, 1.0)),
        ("mm.0.bias".into(), vec![m4], false, bias),
        (
            "mm.2.weight".into(),
            vec![m4, s.out as u64],
            true,
            mat(m4, 1.0),
        ),
        ("mm.2.bias".into(), vec![s.out as u64], false, bias),
    ]);
    let types: Vec<GgmlType> = tensors
        .iter()
        .map(|(_, ne, is_mat, _)| match (is_mat, ty.row_bytes(ne[0])) {
            (false, _) => GgmlType::F32,
            (true, Some(_)) => ty,
            (true, None) => GgmlType::F16,
        })
        .collect();
    for ((name, ne, _, _), &t) in tensors.iter().zip(&types) {
        w.add_tensor(TensorSpec::new(name.clone(), t, ne))?;
    }
    w.set("general.file_type", u32v(u64::from(ty != GgmlType::F32)));
    let mut rng = Rng(616);
    w.write_to_path::<anyhow::Error>(path, true, |i, spec, out| {
        let init = tensors[i].3;
        let row = spec.ne[0] as usize;
        let mut vals = vec![0f32; row];
        let mut bytes = vec![0u8; spec.ty.row_bytes(row as u64).unwrap() as usize];
        for _ in 0..spec.n_elements() as usize / row {
            // bf16 values, as in the released BF16 checkpoints that F16 mmproj files are converted from.
            vals.iter_mut().for_each(|v| {
                *v = f32::from_bits((bf16_rne(rng.next(init)) as u32) << 16);
            });
            quant::quantize_row(spec.ty, &vals, &mut bytes)?;
            out.write_all(&bytes)?;
        }
        Ok(())
    })?;
    Ok(())
}

/// CPU seconds this process has used, all threads (Linux: utime + stime in /proc/self/stat, USER_HZ
/// 100); 0 elsewhere. On a shared machine the wall time per image depends on the other load, the CPU
/// time much less.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |r| r.1);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let size = args.first().map_or("0.8b", |s| s.as_str());
    let ty_name = args.get(1).map_or("f16", |s| s.as_str());
    let ty = GgmlType::from_name(&ty_name.to_uppercase())
        .ok_or_else(|| anyhow::anyhow!("unknown type '{ty_name}'"))?;
    let threads: usize = args.get(2).map_or(Ok(2), |s| s.parse())?;
    let reps: usize = args.get(3).map_or(Ok(3), |s| s.parse())?;
    let grid = std::env::var("GRID").unwrap_or_else(|_| "48x64".into());
    let (gh, gw) = grid
        .split_once('x')
        .and_then(|(h, w)| Some((h.parse().ok()?, w.parse().ok()?)))
        .ok_or_else(|| anyhow::anyhow!("GRID must be HxW patches, e.g. 48x64"))?;

    let s = shape(size);
    let tmp = tempfile::NamedTempFile::new()?;
    let path = std::env::var_os("KEEP").map_or(tmp.path().to_path_buf(), Into::into);
    let t = Instant::now();
    write_mmproj(&path, &s, ty)?;
    let f = mmproj::open(&path)?;
    let mut model = VisionModel::load(&f)?;
    // ARITH=f32|bf16|auto (default auto).
    if let Ok(a) = std::env::var("ARITH") {
        model.arith = clap::ValueEnum::from_str(&a, true).map_err(anyhow::Error::msg)?;
    }
    eprintln!(
        "arithmetic: {:?} (bf16 in use: {})",
        model.arith,
        model.uses_bf16()
    );
    println!(
        "{size} tower, {ty} matrices: {:.0} MiB written and loaded in {:.1} s",
        std::fs::metadata(&path)?.len() as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );

    let pd = model.hp.image.patch_dim();
    let mut rng = Rng(1);
    let px: Vec<f32> = (0..gh * gw * pd)
        .map(|_| {
            rng.next(Init {
                mean: 0.0,
                std: 0.5,
            })
        })
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let mut scratch = VisionScratch::new();
    let (mut times, mut cpu) = (Vec::new(), Vec::new());
    pool.install(|| -> anyhow::Result<()> {
        for rep in 0..=reps {
            let (t, c) = (Instant::now(), cpu_seconds());
            let out = model.encode(&px, gh, gw, &mut scratch)?;
            let (dt, dc) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
            anyhow::ensure!(out.iter().all(|v| v.is_finite()), "non-finite output");
            println!("  run {rep}: {dt:.3} s, {dc:.2} CPU s");
            if rep > 0 {
                times.push(dt);
                cpu.push(dc);
            }
        }
        Ok(())
    })?;
    cpu.sort_by(|a, b| a.partial_cmp(b).unwrap());
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (n, d, ff, m4) = (
        (gh * gw) as f64,
        s.width as f64,
        s.ffn as f64,
        4.0 * s.width as f64,
    );
    // Multiply-adds ×2: patch embedding, per block qkv + out + MLP + the two attention products, merger.
    let flops = 2.0
        * (n * pd as f64 * d
            + s.depth as f64 * (n * d * (4.0 * d + 2.0 * ff) + 2.0 * n * n * d)
            + n / 4.0 * m4 * (m4 + s.out as f64));
    println!(
        "{gh}x{gw} patches ({} merged tokens), {threads} threads: {:.3} s per image (median of {reps}; best {:.3}), \
         {:.0} GFLOP/s; {:.2} CPU s per image (median), {:.0} GFLOP per CPU s",
        gh * gw / 4,
        times[times.len() / 2],
        times[0],
        flops / times[0] / 1e9,
        cpu[cpu.len() / 2],
        flops / cpu[cpu.len() / 2] / 1e9
    );
    Ok(())
}
