//! `deltaq bench`: prompt and generation speed as llama-bench measures them, plus peak RSS, the
//! weight bandwidth decoding achieves and how it compares with the machine's own read bandwidth.

use std::path::PathBuf;

use anyhow::{bail, Context};
use deltaq::bench::{
    cpu_name, draft_costs, huge_page_share, peak_rss, read_bandwidth, run_test, spec_gen,
    weight_sizes, TestKind, TestResult, TestSetup, WeightSizes,
};
use deltaq::gguf::GgufFile;
use deltaq::kernels::kernels;
use deltaq::model::{KvType, Model, UBATCH};
use deltaq::quantize::FileType;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file (or -hf REPO[:QUANT])
    #[arg(
        short = 'm',
        long = "model",
        value_name = "FILE",
        required_unless_present = "hf_repo"
    )]
    model: Option<PathBuf>,
    /// Prompt lengths to test (pp tests), comma-separated; 0 for none
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,
    /// Tokens to generate (tg tests), comma-separated; 0 for none
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,
    /// Depths, comma-separated: tokens already in the context when each test starts (filled untimed;
    /// each test is run at each depth, as llama-bench's -d)
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    n_depth: Vec<usize>,
    /// Thread counts, comma-separated (default: all cores)
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Repetitions of each test
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Context size (default: each test's own token count plus its depth)
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Skip the warm-up run before each test
    #[arg(long)]
    no_warmup: bool,
    /// One JSON object per line and test, with llama-bench's field names plus deltaq's own
    #[arg(long)]
    json: bool,
    /// Size of the buffer of the read-bandwidth test, in MiB (the default is several times the L3 of
    /// server CPUs, which reach 480 MiB)
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    bw_mib: usize,
    /// Seed of the random token ids
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// KV cache type for keys and values: f16 (as llama.cpp), f32 (exact), q8_0 or q4_0 (blocks of 32)
    #[arg(long = "kv-type", value_name = "TYPE", default_value = "f16", value_parser = super::parse_kv_type)]
    kv_type: KvType,
    /// Also measure self-speculative decoding with N drafts per step (the model's MTP block): the
    /// cost of a verification pass and of drafting against a 1-token step, and tg with drafts
    #[arg(long = "draft", value_name = "N")]
    draft: Option<usize>,
    #[command(flatten)]
    rope: super::RopeArgs,
    #[command(flatten)]
    hub: super::pull::HubArgs,
}

/// One test's row, with what is known only at the end (bandwidth).
struct Row {
    threads: usize,
    r: TestResult,
    peak_rss: Option<u64>,
    n_ctx: usize,
    test_time: String,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.reps == 0 {
        bail!("-r must be at least 1");
    }
    let mut tests: Vec<TestKind> = Vec::new();
    tests.extend(
        a.n_prompt
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| TestKind::Prompt(n)),
    );
    tests.extend(
        a.n_gen
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| TestKind::Gen(n)),
    );
    if tests.is_empty() {
        bail!("nothing to measure: -p and -n are both 0");
    }
    let threads: Vec<usize> = if a.threads.is_empty() {
        vec![std::thread::available_parallelism().map_or(1, |n| n.get())]
    } else {
        a.threads.clone()
    };
    if threads.contains(&0) {
        bail!("-t must be at least 1");
    }

    let path = match a.hub.model_path(a.model.as_ref(), false)? {
        Some(p) => p,
        None => match &a.model {
            Some(p) => p.clone(),
            None => bail!("no model: give -m FILE or -hf REPO[:QUANT]"),
        },
    };
    let f = GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut model = Model::load(&f).with_context(|| format!("loading {}", path.display()))?;
    a.rope.apply(&mut model)?;
    model.hp.check_kv_type(a.kv_type)?;
    let n_ctx = |kind: TestKind, depth: usize| a.ctx_size.unwrap_or(depth + kind.n_tokens());
    for &d in &a.n_depth {
        for &t in &tests {
            let c = n_ctx(t, d);
            model.hp.check_ctx(c)?;
            if d + t.n_tokens() > c {
                let at = if d > 0 {
                    format!(" at depth {d}")
                } else {
                    String::new()
                };
                bail!("{}{at} does not fit in the context size {c} (-c)", t.name());
            }
        }
    }
    let sizes = weight_sizes(&f, &model);
    f.release_metadata_pages();
    let isa = kernels().isa.name();

    let mut rows: Vec<Row> = Vec::new();
    for &nt in &threads {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(nt).build()?;
        // llama-bench's order: depths within thread counts, pp tests before tg tests.
        for &n_depth in &a.n_depth {
            for &kind in &tests {
                let n_ctx = n_ctx(kind, n_depth);
                let depth = if n_depth > 0 {
                    format!(" at depth {n_depth}")
                } else {
                    String::new()
                };
                eprintln!(
                    "deltaq bench: {}{depth} threads {}, {} repetitions ...",
                    kind.name(),
                    nt,
                    a.reps
                );
                let test_time = utc_now();
                let setup = TestSetup {
                    reps: a.reps,
                    n_ctx,
                    n_depth,
                    kv_type: a.kv_type,
                    warmup: !a.no_warmup,
                    seed: a.seed,
                };
                let r = pool.install(|| run_test(&model, kind, &setup))?;
                rows.push(Row {
                    threads: nt,
                    r,
                    peak_rss: peak_rss(),
                    n_ctx,
                    test_time,
                });
            }
        }
    }
    let mut spec_lines = Vec::new();
    if let Some(k) = a.draft.filter(|&k| k > 0) {
        deltaq::model::mtp::weights(&model).context("--draft")?;
        let n = a.n_gen.iter().copied().max().unwrap_or(0).max(1);
        for &nt in &threads {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(nt).build()?;
            let setup = TestSetup {
                reps: a.reps,
                n_ctx: n,
                n_depth: 0,
                kv_type: a.kv_type,
                warmup: !a.no_warmup,
                seed: a.seed,
            };
            eprintln!(
                "deltaq bench: {k} drafts, {nt} threads, {} repetitions ...",
                a.reps
            );
            let c = pool.install(|| draft_costs(&model, k, DRAFT_DEPTH, &setup))?;
            let (r, st) = pool.install(|| spec_gen(&model, k, n, &setup))?;
            spec_lines.push((nt, c, r, st));
        }
    }
    // Last: its buffer would otherwise count in the peak RSS of the tests.
    let mut bw: Vec<(usize, f64)> = Vec::new();
    for &nt in &threads {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(nt).build()?;
        let b = pool.install(|| read_bandwidth(a.bw_mib << 20, 10));
        bw.push((nt, b));
    }
    let bw_of = |nt: usize| bw.iter().find(|(t, _)| *t == nt).map_or(0.0, |b| b.1);

    let info = FileInfo::new(&path, &f, &sizes);
    if a.json {
        for row in &rows {
            println!(
                "{}",
                json_line(&info, &sizes, row, bw_of(row.threads), isa, a.kv_type)
            );
        }
    } else {
        print_table(&info, &sizes, &rows, &bw, isa, a.kv_type);
    }
    for (nt, c, r, st) in &spec_lines {
        let ms = |ns: f64| ns / 1e6;
        if a.json {
            let v = serde_json::json!({
                "test": format!("draft{}", c.k),
                "n_threads": nt,
                "n_depth": DRAFT_DEPTH,
                "step_1_ms": ms(c.plain_ns),
                "verify_ms": ms(c.verify_ns),
                "verify_n_tokens": c.k + 1,
                "verify_ratio": c.verify_ratio(),
                "draft_ms": ms(c.draft_ns),
                "spec_step_ratio": c.step_ratio(),
                "projected_speedup_at_70pct": c.speedup(0.7),
                "tg_with_drafts": r.kind.name(),
                "tg_with_drafts_median_ts": r.median_ts(),
                "draft_n": st.proposed,
                "draft_n_accepted": st.accepted,
            });
            println!("{v}");
        } else {
            println!(
                "\n{} drafts, {nt} threads, at depth {DRAFT_DEPTH} (medians): 1-token step {:.2} ms; \
                 verifying {} tokens and rolling back {:.2} ms = {:.2}x; drafting {} {:.2} ms; a speculative step = \
                 {:.2}x a plain one",
                c.k,
                ms(c.plain_ns),
                c.k + 1,
                ms(c.verify_ns),
                c.verify_ratio(),
                c.k,
                ms(c.draft_ns),
                c.step_ratio(),
            );
            let fixture = LLAMA_TINY_KJV_MTP_ACCEPTANCE.get(c.k - 1);
            println!(
                "  projected speed-up at a pooled acceptance of 50 / 70 / 90 %: {:.2}x / {:.2}x / {:.2}x{}",
                c.speedup(0.5),
                c.speedup(0.7),
                c.speedup(0.9),
                fixture.map_or(String::new(), |&r| format!(
                    "; at tiny-kjv-mtp's {:.1} % (llama.cpp, Q8_0): {:.2}x",
                    100.0 * r,
                    c.speedup(r)
                ))
            );
            println!(
                "  {} with drafts (greedy): {:.2} t/s median; {} drafts, {} accepted ({:.1} %)",
                r.kind.name(),
                r.median_ts(),
                st.proposed,
                st.accepted,
                100.0 * st.acceptance()
            );
        }
    }
    Ok(())
}

/// llama.cpp's draft acceptance on tiny-kjv-mtp Q8_0 (eval-john, 1 / 2 / 3 drafts per step): the
/// fixture's reference rates for the projections.
const LLAMA_TINY_KJV_MTP_ACCEPTANCE: [f64; 3] = [0.615, 0.469, 0.357];

/// Tokens in the sequence when the draft costs are measured.
const DRAFT_DEPTH: usize = 64;

struct FileInfo {
    filename: String,
    model_type: String,
    /// Share of the mapped weights held in 2 MiB pages after the tests.
    huge_share: Option<f64>,
}

impl FileInfo {
    fn new(path: &std::path::Path, f: &GgufFile, s: &WeightSizes) -> FileInfo {
        let ftype = f
            .get_u64("general.file_type")
            .ok()
            .and_then(|id| FileType::ALL.into_iter().find(|t| u64::from(t.id()) == id))
            .map_or("?", |t| t.name());
        let arch = f.get_str("general.architecture").unwrap_or("?");
        FileInfo {
            filename: path.display().to_string(),
            model_type: format!("{arch} {} {ftype}", params_label(s.n_params)),
            huge_share: huge_page_share(f.bytes().as_ptr() as usize),
        }
    }
}

fn params_label(n: u64) -> String {
    let b = n as f64 / 1e9;
    if b >= 1.0 {
        format!("{b:.2}B")
    } else {
        format!("{:.0}M", n as f64 / 1e6)
    }
}

/// Achieved weight bandwidth of a tg test at its median speed, bytes/s (`None` for pp tests).
fn weight_bw(sizes: &WeightSizes, r: &TestResult) -> Option<f64> {
    match r.kind {
        TestKind::Gen(_) => Some(sizes.bytes_per_token as f64 * r.median_ts()),
        TestKind::Prompt(_) => None,
    }
}

fn json_line(
    info: &FileInfo,
    sizes: &WeightSizes,
    row: &Row,
    bw: f64,
    isa: &str,
    kv: KvType,
) -> String {
    let r = &row.r;
    let (n_prompt, n_gen) = match r.kind {
        TestKind::Prompt(n) => (n, 0),
        TestKind::Gen(n) => (0, n),
    };
    let wbw = weight_bw(sizes, r);
    let v = serde_json::json!({
        "build_commit": concat!("deltaq-", env!("CARGO_PKG_VERSION")),
        "cpu_info": cpu_name(),
        "backends": "CPU",
        "model_filename": info.filename,
        "model_type": info.model_type,
        "model_size": sizes.file_tensor_bytes,
        "model_n_params": sizes.n_params,
        "n_batch": n_prompt.max(1),
        "n_ubatch": UBATCH,
        "n_threads": row.threads,
        "type_k": kv.name(),
        "type_v": kv.name(),
        "n_gpu_layers": 0,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_depth": r.n_depth,
        "test_time": row.test_time,
        "avg_ns": r.avg_ns().round() as u64,
        "stddev_ns": r.stddev_ns().round() as u64,
        "avg_ts": r.avg_ts(),
        "stddev_ts": r.stddev_ts(),
        "samples_ns": r.samples_ns,
        "samples_ts": r.samples_ts(),
        // deltaq's own fields
        "test": r.name(),
        "median_ts": r.median_ts(),
        "isa": isa,
        "n_ctx": row.n_ctx,
        "peak_rss_bytes": row.peak_rss,
        "kv_cache_bytes": r.kv_bytes,
        "recurrent_state_bytes": r.recurrent_bytes,
        "weight_bytes_per_token": sizes.bytes_per_token,
        "weight_gbps": wbw.map(|b| b / 1e9),
        "read_bw_gbps": bw / 1e9,
        "bw_pct": wbw.map(|b| 100.0 * b / bw.max(1.0)),
        "weights_huge_page_share": info.huge_share,
    });
    v.to_string()
}

fn print_table(
    info: &FileInfo,
    sizes: &WeightSizes,
    rows: &[Row],
    bw: &[(usize, f64)],
    isa: &str,
    kv: KvType,
) {
    let header = [
        "model",
        "size",
        "params",
        "isa",
        "threads",
        "test",
        "t/s",
        "median t/s",
        "weights GB/s",
        "% of read BW",
        "peak RSS",
    ];
    let mut table: Vec<Vec<String>> = Vec::new();
    for row in rows {
        let r = &row.r;
        let read_bw = bw
            .iter()
            .find(|(t, _)| *t == row.threads)
            .map_or(0.0, |b| b.1);
        let wbw = weight_bw(sizes, r);
        table.push(vec![
            info.model_type.clone(),
            format!(
                "{:.2} GiB",
                sizes.file_tensor_bytes as f64 / (1u64 << 30) as f64
            ),
            params_label(sizes.n_params),
            isa.to_string(),
            row.threads.to_string(),
            r.name(),
            format!("{:.2} ± {:.2}", r.avg_ts(), r.stddev_ts()),
            format!("{:.2}", r.median_ts()),
            wbw.map_or("-".into(), |b| format!("{:.2}", b / 1e9)),
            wbw.map_or("-".into(), |b| {
                format!("{:.0} %", 100.0 * b / read_bw.max(1.0))
            }),
            row.peak_rss.map_or("?".into(), |b| {
                format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
            }),
        ]);
    }
    print!("{}", super::table::markdown(&header, &table, 4));
    println!();
    println!("cpu: {}", cpu_name());
    let bws: Vec<String> = bw
        .iter()
        .map(|(t, b)| {
            format!(
                "{t} thread{}: {:.1} GB/s",
                if *t == 1 { "" } else { "s" },
                b / 1e9
            )
        })
        .collect();
    println!("read bandwidth (best streaming read): {}", bws.join(", "));
    println!(
        "weights read per decoded token: {:.1} MB (tensors in the file: {:.1} MB)",
        sizes.bytes_per_token as f64 / 1e6,
        sizes.file_tensor_bytes as f64 / 1e6
    );
    if let Some(h) = info.huge_share {
        println!(
            "weights mapped in 2 MiB pages: {:.0} %{}",
            100.0 * h,
            if h < 0.5 {
                " (the file was cached in small pages before this run; decoding is faster once it is \
                 read again into huge pages: see the README)"
            } else {
                ""
            }
        );
    }
    // State of the longest test: KV cache per token and the fixed recurrent state.
    if let Some(row) = rows
        .iter()
        .max_by_key(|r| r.r.n_depth + r.r.kind.n_tokens())
    {
        let n = row.r.n_depth + row.r.kind.n_tokens();
        println!(
            "sequence state after {} tokens: KV cache ({kv}) {:.1} MiB ({} B/token as allocated), recurrent state {:.2} MiB",
            n,
            row.r.kv_bytes as f64 / (1u64 << 20) as f64,
            row.r.kv_bytes / n.max(1),
            row.r.recurrent_bytes as f64 / (1u64 << 20) as f64,
        );
    }
}

/// The current time as RFC 3339 UTC (llama-bench's `test_time`), without a date library.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
