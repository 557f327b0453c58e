//! `deltaq perplexity`: llama-perplexity's measurement for one file, or a comparison of several (KL
//! divergence from a base file, a table, JSON, an SVG plot), optionally quantizing the variants first.

use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use deltaq::gguf::GgufFile;
use deltaq::model::{KvType, Model};
use deltaq::perplexity::{self as ppl, LogitsWriter, Options, Plan, PlotPoint, Scores};
use deltaq::quantize::{
    quantize_file, quantize_file_to_bpw, FileType, ImatrixOptions, QuantizeOptions, TARGET_BPW_KEY,
};
use deltaq::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file; repeat to compare several (the first is the KL base unless --base)
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    models: Vec<PathBuf>,
    /// Model from Hugging Face, OWNER/NAME[:QUANT] or OWNER/NAME/PATH.gguf, downloaded into the
    /// cache unless it is there; repeatable, evaluated after the -m files (also -hf)
    #[arg(long = "hf-repo", visible_alias = "hf", value_name = "REPO[:QUANT]")]
    hf_repos: Vec<String>,
    /// Use the download cache only for -hf, never the network
    #[arg(long)]
    offline: bool,
    /// Evaluation text (UTF-8), e.g. eval/eval-john.txt or wikitext-2's wiki.test.raw
    #[arg(short = 'f', long = "file", value_name = "TEXT")]
    text: PathBuf,
    /// Window (context) size: the text is cut into windows of this many tokens, the second half of each
    /// is scored
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Tokens per forward call within a window (default: the whole window); smaller uses less memory
    #[arg(short = 'b', long = "batch-size")]
    batch_size: Option<usize>,
    /// Evaluate only the first N windows
    #[arg(long, value_name = "N")]
    chunks: Option<usize>,
    /// Reference file for KL divergence and Δ perplexity (default: the first model)
    #[arg(long, value_name = "FILE")]
    base: Option<PathBuf>,
    /// Also evaluate every .gguf file in DIR (sorted from most to fewest bits per weight)
    #[arg(long, value_name = "DIR")]
    sweep: Option<PathBuf>,
    /// Make quantized variants of this F32/F16 file (see --types) and compare them with it
    #[arg(long, value_name = "FILE")]
    quantize_from: Option<PathBuf>,
    /// Types for --quantize-from, comma-separated llama-quantize names
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_ftype,
        default_value = "q8_0,q6_k,q5_k_m,q4_k_m,q3_k_m,q2_k"
    )]
    types: Vec<FileType>,
    /// With --quantize-from: also make every type with this importance matrix (llama-imatrix or
    /// deltaq imatrix, GGUF or .dat) and compare both variants; types that need one are made with it only
    #[arg(long, value_name = "FILE", requires = "quantize_from")]
    imatrix: Option<PathBuf>,
    /// With --quantize-from: also make files with `quantize --target-bpw N` for each N (comma-separated),
    /// with the importance matrix if given and without it
    #[arg(
        long,
        value_name = "N,...",
        value_delimiter = ',',
        requires = "quantize_from"
    )]
    target_bpw: Vec<f64>,
    /// Keep the files made by --quantize-from (their folder is printed) instead of deleting them
    #[arg(long)]
    keep: bool,
    /// Print one JSON object per file (one per line) instead of the table
    #[arg(long)]
    json: bool,
    /// Write an SVG plot of perplexity (and KL divergence) against bits per weight
    #[arg(long, value_name = "OUT.svg")]
    plot: Option<PathBuf>,
    /// Save the base file's log-probabilities in llama-perplexity's --kl-divergence-base format
    #[arg(long, value_name = "PATH")]
    save_logits: Option<PathBuf>,
    /// Threads (default: all cores)
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// KV cache type for keys and values: f16 (as llama.cpp), f32 (exact), q8_0 or q4_0 (blocks of 32)
    /// (several, comma-separated, with one model: the model runs with each, the first the KL base)
    #[arg(long = "kv-type", value_name = "TYPE", default_value = "f16", value_delimiter = ',', value_parser = super::parse_kv_type)]
    kv_type: Vec<KvType>,
    #[command(flatten)]
    rope: super::RopeArgs,
}

fn parse_ftype(s: &str) -> Result<FileType, String> {
    FileType::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = FileType::ALL.iter().map(|f| f.name()).collect();
        format!("unknown type '{s}' (one of: {})", names.join(", "))
    })
}

/// What the table says about a file besides its scores.
struct FileInfo {
    path: PathBuf,
    name: String,
    ftype: String,
    /// Made with an importance matrix (llama-quantize's `quantize.imatrix.*` keys).
    imatrix: bool,
    /// Made by `quantize --target-bpw` (its target).
    target_bpw: Option<f32>,
    size: u64,
    bpw: f64,
}

fn file_info(path: &Path, f: &GgufFile) -> FileInfo {
    let target_bpw = f.get_f32(TARGET_BPW_KEY).ok();
    let ftype = match target_bpw {
        Some(t) => format!("target {t}"),
        None => f
            .get_u64("general.file_type")
            .ok()
            .and_then(|id| FileType::ALL.into_iter().find(|t| t.id() as u64 == id))
            .map_or_else(|| "?".to_string(), |t| t.name().to_string()),
    };
    let (mut bytes, mut elements) = (0u64, 0u64);
    for t in f.tensors() {
        bytes += f.tensor_data(t).len() as u64;
        elements += t.n_elements();
    }
    FileInfo {
        path: path.to_path_buf(),
        name: path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        ftype,
        imatrix: f.get("quantize.imatrix.file").is_some()
            || f.get("quantize.imatrix.entries_count").is_some(),
        target_bpw,
        size: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        bpw: bytes as f64 * 8.0 / elements.max(1) as f64,
    }
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    // The text first: its errors are the cheapest to report.
    let bytes = std::fs::read(&a.text).with_context(|| format!("reading {}", a.text.display()))?;
    let text = ppl::text_from_bytes(bytes, &a.text.display().to_string())?;

    let mut paths: Vec<PathBuf> = Vec::new();
    let mut base_path = a.base.clone();
    let mut tmp: Option<tempfile::TempDir> = None;
    if let Some(src) = &a.quantize_from {
        if a.types.is_empty() && a.target_bpw.is_empty() {
            bail!("--types is empty");
        }
        let dir = tempfile::Builder::new().prefix("deltaq-ppl-").tempdir()?;
        let stem = src
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
        // model-F16.gguf -> model-Q8_0.gguf, ...
        let stem = match stem.rsplit_once(['-', '.', '_']) {
            Some((head, t)) if FileType::from_name(t).is_some() && !head.is_empty() => {
                head.to_string()
            }
            _ => stem,
        };
        paths.push(src.clone());
        base_path.get_or_insert_with(|| src.clone());
        let imatrix = a.imatrix.as_ref().map(|path| ImatrixOptions {
            path: path.clone(),
            include: Vec::new(),
            exclude: Vec::new(),
        });
        for &ty in &a.types {
            // Without the matrix unless the type cannot be made so; with it too when one is given.
            let mut variants = Vec::new();
            if imatrix.is_none() || !ty.needs_imatrix() {
                variants.push(None);
            }
            variants.extend(imatrix.clone().map(Some));
            for im in variants {
                let suffix = if im.is_some() { "-imatrix" } else { "" };
                let out = dir
                    .path()
                    .join(format!("{stem}-{}{suffix}.gguf", ty.name()));
                let with = if im.is_some() {
                    " with the importance matrix"
                } else {
                    ""
                };
                eprintln!("quantizing {} to {ty}{with}", src.display());
                let opts = QuantizeOptions {
                    ftype: ty,
                    pure: false,
                    keep: Vec::new(),
                    overwrite: true,
                    progress: true,
                    imatrix: im,
                    token_embedding_type: None,
                    output_tensor_type: None,
                    tensor_types: Vec::new(),
                };
                quantize_file(src, &out, &opts)
                    .with_context(|| format!("quantizing {} to {ty}{with}", src.display()))?;
                paths.push(out);
            }
        }
        for &target in &a.target_bpw {
            let variants = std::iter::once(None).chain(imatrix.clone().map(Some));
            for im in variants {
                let suffix = if im.is_some() { "-imatrix" } else { "" };
                let out = dir.path().join(format!("{stem}-bpw{target}{suffix}.gguf"));
                let with = if im.is_some() {
                    " with the importance matrix"
                } else {
                    ""
                };
                eprintln!(
                    "quantizing {} to at most {target} bits per weight{with}",
                    src.display()
                );
                let opts = QuantizeOptions {
                    ftype: FileType::F32,
                    pure: false,
                    keep: Vec::new(),
                    overwrite: true,
                    progress: true,
                    imatrix: im,
                    token_embedding_type: None,
                    output_tensor_type: None,
                    tensor_types: Vec::new(),
                };
                quantize_file_to_bpw(src, &out, target, &opts).with_context(|| {
                    format!("quantizing {} to {target} bpw{with}", src.display())
                })?;
                paths.push(out);
            }
        }
        tmp = Some(dir);
    }
    paths.extend(a.models.iter().cloned());
    for spec in &a.hf_repos {
        paths.push(super::pull::pull_model_file(spec, a.offline)?);
    }
    let mut swept = Vec::new();
    if let Some(dir) = &a.sweep {
        for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
                && p.is_file()
            {
                swept.push(p);
            }
        }
        if swept.is_empty() {
            bail!("{} holds no .gguf file", dir.display());
        }
    }
    if paths.is_empty() && swept.is_empty() {
        bail!(
            "no model: give -m FILE or -hf REPO[:QUANT] (repeatable), --sweep DIR or \
             --quantize-from FILE"
        );
    }

    let result = evaluate_files(&a, &text, paths, swept, base_path);
    if let Some(dir) = tmp {
        if a.keep {
            let kept = dir.keep();
            eprintln!("kept the quantized files in {}", kept.display());
        } else {
            dir.close()?;
        }
    }
    result
}

fn evaluate_files(
    a: &Args,
    text: &str,
    mut paths: Vec<PathBuf>,
    swept: Vec<PathBuf>,
    base_path: Option<PathBuf>,
) -> anyhow::Result<()> {
    // Open everything (memory-mapped).
    let open = |p: &Path| GgufFile::open(p).with_context(|| format!("opening {}", p.display()));
    let mut swept: Vec<(PathBuf, GgufFile)> = swept
        .into_iter()
        .map(|p| open(&p).map(|f| (p, f)))
        .collect::<anyhow::Result<_>>()?;
    let mut files: Vec<(PathBuf, GgufFile)> = paths
        .drain(..)
        .map(|p| open(&p).map(|f| (p, f)))
        .collect::<anyhow::Result<_>>()?;
    swept.sort_by(|(pa, fa), (pb, fb)| {
        let (ia, ib) = (file_info(pa, fa), file_info(pb, fb));
        ib.bpw.total_cmp(&ia.bpw).then(ia.name.cmp(&ib.name))
    });
    for (p, f) in swept {
        if !files.iter().any(|(q, _)| same_path(q, &p)) {
            files.push((p, f));
        }
    }
    let base = match &base_path {
        Some(b) => match files.iter().position(|(p, _)| same_path(p, b)) {
            Some(i) => i,
            None => {
                files.insert(0, (b.clone(), open(b)?));
                0
            }
        },
        None => 0,
    };
    let mut infos: Vec<FileInfo> = files.iter().map(|(p, f)| file_info(p, f)).collect();
    // Several KV cache types: one model, run once per type.
    let kv_types = a.kv_type.clone();
    if kv_types.len() > 1 {
        if files.len() != 1 {
            bail!("several --kv-type values compare KV cache types of one model: give one -m file");
        }
        let info = infos.remove(0);
        for t in &kv_types {
            infos.push(FileInfo {
                name: format!("{} (KV {t})", info.name),
                ftype: format!("{} KV {t}", info.ftype),
                path: info.path.clone(),
                ..info
            });
        }
    }

    let tokenizers: Vec<Tokenizer> = files
        .iter()
        .map(|(p, f)| {
            Tokenizer::from_gguf(f)
                .with_context(|| format!("reading the tokenizer of {}", p.display()))
        })
        .collect::<anyhow::Result<_>>()?;
    for (i, t) in tokenizers.iter().enumerate() {
        if i != base {
            ppl::check_same_vocab(&tokenizers[base], t, &infos[base].name, &infos[i].name)?;
        }
    }
    let models: Vec<Model> = files
        .iter()
        .map(|(p, f)| {
            let mut m = Model::load(f).with_context(|| format!("loading {}", p.display()))?;
            a.rope.apply(&mut m)?;
            for &t in &kv_types {
                m.hp.check_kv_type(t)?;
            }
            m.hp.check_ctx(a.ctx_size)
                .with_context(|| format!("{}", p.display()))?;
            Ok(m)
        })
        .collect::<anyhow::Result<_>>()?;
    let (model_refs, run_kv): (Vec<&Model>, Vec<KvType>) = if kv_types.len() > 1 {
        kv_types.iter().map(|&t| (&models[0], t)).unzip()
    } else {
        models.iter().map(|m| (m, kv_types[0])).unzip()
    };

    let tokens = ppl::tokenize(&tokenizers[base], text)?;
    let opts = Options {
        n_ctx: a.ctx_size,
        n_batch: a.batch_size.unwrap_or(a.ctx_size),
        max_chunks: a.chunks,
        kv_type: kv_types[0],
    };
    let plan = Plan::new(tokens.len(), &opts)
        .with_context(|| format!("{} is too short", a.text.display()))?;
    eprintln!(
        "{}: {} tokens, {} windows of {} tokens ({} scored per window), {} file(s), base {}",
        a.text.display(),
        tokens.len(),
        plan.n_chunk,
        plan.n_ctx,
        plan.n_scored(),
        files.len(),
        infos[base].name
    );

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.unwrap_or(0))
        .build()?;
    let n_models = model_refs.len();
    let bar = indicatif::ProgressBar::new((plan.n_chunk * n_models) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} windows×files ETA {eta:>4} {wide_msg}",
        )
        .expect("valid template"),
    );
    let mut line = String::new();
    let mut chunk_ppl = vec![0.0; n_models];
    let mut progress = |p: ppl::Progress| {
        bar.inc(1);
        chunk_ppl[p.model] = p.ppl;
        if n_models == 1 {
            let item = format!("[{}]{:.4},", p.chunk, p.ppl);
            if bar.is_hidden() {
                eprint!("{item}");
            } else {
                line.push_str(&item);
                if p.chunk.is_multiple_of(8) || p.chunk == p.n_chunk {
                    bar.println(std::mem::take(&mut line));
                }
            }
            bar.set_message(format!("ppl {:.4}", p.ppl));
            return;
        }
        // Several files: one line per window, when the last file of the window is done (the base runs
        // first, then the others in order).
        let last = if base == n_models - 1 {
            n_models - 2
        } else {
            n_models - 1
        };
        if p.model == last {
            let vals: Vec<String> = chunk_ppl.iter().map(|v| format!("{v:.4}")).collect();
            let msg = format!("[{}] {}", p.chunk, vals.join(" "));
            if bar.is_hidden() {
                eprintln!("{msg}");
            } else {
                bar.println(&msg);
            }
        }
    };
    let mut writer = match &a.save_logits {
        Some(p) => {
            let f =
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            Some(LogitsWriter::new(
                BufWriter::new(f),
                &plan,
                models[base].n_vocab(),
                &tokens,
            )?)
        }
        None => None,
    };
    let mut save = |logits: &[f32]| -> anyhow::Result<()> {
        match writer.as_mut() {
            Some(w) => w.write_rows(logits),
            None => Ok(()),
        }
    };
    let save_ref: Option<&mut deltaq::perplexity::SaveFn<'_>> = if a.save_logits.is_some() {
        Some(&mut save)
    } else {
        None
    };
    let scores = pool.install(|| {
        ppl::evaluate_kv(
            &model_refs,
            &run_kv,
            base,
            &tokens,
            &plan,
            &mut progress,
            save_ref,
        )
    })?;
    bar.finish_and_clear();
    if n_models == 1 && bar.is_hidden() {
        eprintln!();
    }
    if let (Some(w), Some(p)) = (writer, &a.save_logits) {
        w.finish()?;
        eprintln!(
            "saved the base log-probabilities of {} to {}",
            infos[base].name,
            p.display()
        );
    }

    let out = std::io::stdout();
    let mut out = out.lock();
    if a.json {
        for (i, (info, s)) in infos.iter().zip(&scores).enumerate() {
            writeln!(
                out,
                "{}",
                json_line(info, s, &plan, tokens.len(), i == base)
            )?;
        }
    } else {
        for (info, s) in infos.iter().zip(&scores) {
            let prefix = if n_models > 1 {
                format!("{}: ", info.name)
            } else {
                String::new()
            };
            writeln!(
                out,
                "{prefix}Final estimate: PPL = {:.4} +/- {:.5}  ({} tokens, {:.1} tokens/s)",
                s.ppl(),
                s.ppl_err(),
                s.eval_tokens,
                s.tokens_per_second()
            )?;
        }
        if n_models > 1 {
            writeln!(out)?;
            write!(out, "{}", table(&infos, &scores, base))?;
        }
    }
    if let Some(p) = &a.plot {
        let labels = labels(&infos);
        let points: Vec<PlotPoint> = infos
            .iter()
            .zip(&scores)
            .zip(labels)
            .enumerate()
            .map(|(i, ((info, s), label))| PlotPoint {
                label,
                bpw: info.bpw,
                ppl: s.ppl(),
                ppl_err: s.ppl_err(),
                kl_mean: s.kl.as_ref().map(|k| k.mean),
                reference: i == base || is_unquantized(&info.ftype),
                imatrix: info.imatrix,
                target_bpw: info.target_bpw.is_some(),
            })
            .collect();
        let text_name = a
            .text
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let title = format!(
            "Perplexity vs bits per weight: {text_name}, -c {}, {} windows",
            plan.n_ctx, plan.n_chunk
        );
        let svg = ppl::plot_svg(&title, &points).map_err(anyhow::Error::msg)?;
        write_atomically(p, svg.as_bytes()).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

/// F32, F16 and BF16 files: the references the quantized files are measured against.
fn is_unquantized(ftype: &str) -> bool {
    matches!(ftype, "F32" | "F16" | "BF16")
}

/// `bytes` into `path` through a temporary file in the same folder, renamed over it when complete.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    // a temporary file is private; the plot is not
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Point labels: the file types when they tell the files apart, else the file names.
fn labels(infos: &[FileInfo]) -> Vec<String> {
    let typed = |i: &FileInfo| {
        let mark = if i.imatrix { " imatrix" } else { "" };
        format!("{}{mark}", i.ftype)
    };
    let mut types: Vec<String> = infos.iter().map(typed).collect();
    types.sort_unstable();
    types.dedup();
    if types.len() == infos.len() && !infos.iter().any(|i| i.ftype == "?") {
        infos.iter().map(typed).collect()
    } else {
        infos.iter().map(|i| i.name.clone()).collect()
    }
}

fn json_line(info: &FileInfo, s: &Scores, plan: &Plan, n_tokens: usize, is_base: bool) -> String {
    let kl = s.kl.as_ref();
    let v = serde_json::json!({
        "file": info.path.display().to_string(),
        "type": info.ftype,
        "imatrix": info.imatrix,
        "size_bytes": info.size,
        "bpw": info.bpw,
        "ppl": s.ppl(),
        "ppl_err": s.ppl_err(),
        "base": is_base && kl.is_some(),
        "delta_ppl_pct": kl.map(|k| 100.0 * k.ppl_ratio_minus_1),
        "delta_ppl_pct_err": kl.map(|k| 100.0 * k.ppl_ratio_err),
        "kl_mean": kl.map(|k| k.mean),
        "kl_mean_err": kl.map(|k| k.mean_err),
        "kl_median": kl.map(|k| k.median),
        "kl_p99": kl.map(|k| k.p99),
        "kl_max": kl.map(|k| k.max),
        "top1": kl.map(|k| 100.0 * k.same_top),
        "tokens_per_second": s.tokens_per_second(),
        "eval_seconds": s.eval_seconds,
        "scored_tokens": s.nll.count,
        "text_tokens": n_tokens,
        "chunks": plan.n_chunk,
        "n_ctx": plan.n_ctx,
    });
    v.to_string()
}

/// A Markdown table, so it can be pasted into documentation.
fn table(infos: &[FileInfo], scores: &[Scores], base: usize) -> String {
    let header = [
        "file",
        "type",
        "size MiB",
        "bpw",
        "PPL",
        "Δ PPL",
        "KL mean",
        "KL p99",
        "same top-1",
        "tok/s",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (i, (info, s)) in infos.iter().zip(scores).enumerate() {
        let kl = s.kl.as_ref();
        let (delta, klm, klp, top) = match kl {
            Some(_) if i == base => ("base".into(), "-".into(), "-".into(), "-".into()),
            Some(k) => (
                format!(
                    "{:+.2} ± {:.2} %",
                    100.0 * k.ppl_ratio_minus_1,
                    100.0 * k.ppl_ratio_err
                ),
                format!("{:.6}", k.mean),
                format!("{:.5}", k.p99),
                format!("{:.2} %", 100.0 * k.same_top),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        rows.push(vec![
            info.name.clone(),
            info.ftype.clone(),
            format!("{:.2}", info.size as f64 / (1u64 << 20) as f64),
            format!("{:.3}", info.bpw),
            format!("{:.4} ± {:.4}", s.ppl(), s.ppl_err()),
            delta,
            klm,
            klp,
            top,
            format!("{:.0}", s.tokens_per_second()),
        ]);
    }
    super::table::markdown(&header, &rows, 2)
}
