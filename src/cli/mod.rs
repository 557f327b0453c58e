//! Subcommands, in llama.cpp's conventions where it has one.

mod bench;
mod convert;
mod eval;
mod imatrix;
mod inspect;
mod perplexity;
mod pull;
mod quantize;
mod run;
mod serve;
mod table;
mod tensor;
mod tokenize;

use clap::{Parser, Subcommand};
use deltaq::model::KvType;

#[derive(Parser)]
#[command(name = "deltaq", version, about = "Run Qwen3.5 GGUF models on CPUs")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text, or chat interactively when no prompt is given
    Run(run::Args),
    /// Convert a Hugging Face safetensors checkpoint to GGUF (like convert_hf_to_gguf.py)
    Convert(convert::Args),
    /// Run the model on token ids and write the logits of every position as .npy
    Eval(eval::Args),
    /// Print a GGUF file's metadata and tensor table (like gguf-dump)
    Inspect(inspect::Args),
    /// Write one tensor, dequantized to float32, as a NumPy .npy file
    Tensor(tensor::Args),
    /// Tokenize text with a GGUF file's tokenizer (like llama-tokenize)
    Tokenize(tokenize::Args),
    /// Quantize a GGUF file with llama-quantize's recipes
    Quantize(quantize::Args),
    /// Importance matrix of a model over a calibration text (like llama-imatrix), for quantizing
    Imatrix(imatrix::Args),
    /// Prompt and generation speed like llama-bench, with peak RSS and the weight bandwidth of decoding
    Bench(bench::Args),
    /// Perplexity of GGUF files on a text (like llama-perplexity), KL divergence between them, a table
    /// and a plot; --quantize-from makes the quantized variants first
    Perplexity(perplexity::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (chat, completions, streaming, prompt cache)
    Serve(serve::Args),
    /// Download a model from Hugging Face into the cache (REPO[:QUANT], as llama.cpp's -hf) and
    /// print its path
    Pull(pull::PullArgs),
    /// List the models in the download cache
    List(pull::ListArgs),
}

pub use pull::rewrite_hf_flags;

/// What `deltaq --version` prints after the name: the version, the git commit the binary was built
/// from, and the kernel table this CPU runs (and the others it could).
pub fn version() -> String {
    let chosen = deltaq::kernels::kernels().isa.name();
    let all: Vec<&str> = deltaq::kernels::available()
        .iter()
        .map(|k| k.isa.name())
        .collect();
    format!(
        "{} (commit {})\nkernels: {chosen} (this CPU runs: {})",
        env!("CARGO_PKG_VERSION"),
        env!("DELTAQ_GIT_COMMIT"),
        all.join(", ")
    )
}

/// `--kv-type`: the KV cache's element type (llama.cpp's `-ctk`/`-ctv`, one flag for both).
fn parse_kv_type(s: &str) -> Result<KvType, String> {
    KvType::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
        format!("unknown KV cache type '{s}' (one of: {})", names.join(", "))
    })
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Tensor(a) => tensor::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Imatrix(a) => imatrix::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Pull(a) => pull::run_pull(a),
        Command::List(a) => pull::run_list(a),
    }
}

/// Drafting with the model's MTP block (self-speculative decoding), as llama.cpp's
/// `--spec-type draft-mtp` flags: shared by `run` and `serve`.
#[derive(clap::Args, Clone, Debug)]
pub struct DraftArgs {
    /// Most tokens drafted per step with the model's MTP block (0: off; default when the model has the
    /// block: 2 with the AVX-512 kernels, else 1; drafting switches itself off while it measures slower
    /// than plain decoding)
    #[arg(long = "draft", value_name = "N")]
    pub n_max: Option<usize>,
    /// Stop drafting a step when the draft's top probability is below P
    #[arg(long = "draft-p-min", value_name = "P", default_value_t = 0.0)]
    pub p_min: f32,
    /// Draft from the first N token ids only (the most frequent BPE pieces; 0: the whole vocabulary;
    /// default: 32768 for vocabularies over 65536 tokens, else all)
    #[arg(long = "draft-vocab", value_name = "N")]
    pub vocab: Option<usize>,
    /// Draft at every step, even while drafting measures slower than plain decoding
    #[arg(long = "draft-always")]
    pub always: bool,
}

impl DraftArgs {
    pub fn settings(&self) -> deltaq::model::DraftSettings {
        deltaq::model::DraftSettings {
            n_max: self.n_max,
            p_min: self.p_min,
            vocab: self.vocab,
            always: self.always,
        }
    }

    /// The drafter for `model` (see [`deltaq::model::DraftSettings::drafter`]); a note goes to stderr.
    pub fn drafter(&self, model: &deltaq::model::Model) -> Option<deltaq::model::Drafter> {
        let (d, note) = self.settings().drafter(model);
        if let Some(n) = note {
            eprintln!("note: {n}");
        }
        d
    }
}

/// Image input (llama.cpp's `--mmproj`, `--image`, `--image-min-tokens`, `--image-max-tokens`).
#[derive(clap::Args)]
pub struct ImageArgs {
    /// Vision tower GGUF (mmproj) of the model, for image input
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<std::path::PathBuf>,
    /// Image file (PNG, JPEG or WebP) to put before the prompt; repeat for several
    #[arg(long, value_name = "FILE")]
    pub image: Vec<std::path::PathBuf>,
    /// Fewest tokens an image becomes (one token = 32 × 32 pixels; default: the mmproj's, else 64)
    #[arg(long = "image-min-tokens", value_name = "N")]
    pub min_tokens: Option<usize>,
    /// Most tokens an image becomes (default: the mmproj's, else 4096)
    #[arg(long = "image-max-tokens", value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Arithmetic of the vision tower's matrix products: auto (bf16 where the CPU has AVX512-BF16 and the
    /// mmproj's matrices are bf16 values, as in F16/BF16 files of the released checkpoints; else f32),
    /// f32, or bf16 (activations rounded to bf16, as transformers runs the model in bf16; about twice as
    /// fast as f32)
    #[arg(
        long = "image-arith",
        value_enum,
        default_value_t,
        value_name = "ARITH"
    )]
    pub arith: deltaq::vision::tower::Arith,
}

impl ImageArgs {
    /// The mmproj file, if given; `--image` without it is an error.
    pub fn open_mmproj(&self) -> anyhow::Result<Option<deltaq::gguf::GgufFile>> {
        use anyhow::Context;
        match &self.mmproj {
            None if !self.image.is_empty() => anyhow::bail!(
                "--image needs --mmproj: the model's vision tower file (mmproj-*.gguf)"
            ),
            None if self.min_tokens.is_some() || self.max_tokens.is_some() => {
                anyhow::bail!("--image-min-tokens / --image-max-tokens need --mmproj")
            }
            None => Ok(None),
            Some(p) => deltaq::vision::mmproj::open(p)
                .with_context(|| format!("opening the mmproj {}", p.display()))
                .map(Some),
        }
    }

    /// The vision tower of `mmproj` for a text model of width `n_embd`, with these flags' limits.
    pub fn encoder<'a>(
        &self,
        mmproj: &'a deltaq::gguf::GgufFile,
        n_embd: usize,
    ) -> anyhow::Result<deltaq::vision::encoder::ImageEncoder<'a>> {
        use anyhow::Context;
        let name = self
            .mmproj
            .as_deref()
            .unwrap_or(std::path::Path::new("mmproj"));
        let mut enc = deltaq::vision::encoder::ImageEncoder::new(
            mmproj,
            n_embd,
            self.min_tokens,
            self.max_tokens,
        )
        .with_context(|| format!("mmproj {}", name.display()))?;
        enc.model.arith = self.arith;
        Ok(enc)
    }
}

/// Reads and encodes image files, printing each one's size and times to stderr.
pub fn encode_image_files(
    enc: &deltaq::vision::encoder::ImageEncoder<'_>,
    paths: &[std::path::PathBuf],
) -> anyhow::Result<Vec<std::sync::Arc<deltaq::model::ImageEmbd>>> {
    use anyhow::Context;
    let mut scratch = deltaq::vision::tower::VisionScratch::new();
    let mut out = Vec::with_capacity(paths.len());
    for p in paths {
        let bytes =
            std::fs::read(p).with_context(|| format!("reading the image {}", p.display()))?;
        let e = enc
            .encode_bytes(&bytes, &mut scratch)
            .with_context(|| format!("image {}", p.display()))?;
        let (rows, cols) = e.image.grid();
        eprintln!(
            "image {}: {} tokens ({rows} x {cols}), preprocessed in {:.1} ms, encoded in {:.1} ms",
            p.display(),
            e.image.n_tokens(),
            e.preprocess_secs * 1e3,
            e.encode_secs * 1e3
        );
        out.push(e.image);
    }
    Ok(out)
}

/// RoPE scaling over the file's settings, as llama.cpp's flags: contexts beyond the training context.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RopeArgs {
    /// RoPE frequency scaling: none, linear or yarn (default: the file's, else linear)
    #[arg(long = "rope-scaling", value_name = "{none,linear,yarn}", value_parser = parse_rope_scaling)]
    pub scaling: Option<deltaq::model::RopeScalingType>,
    /// RoPE context scaling factor: the context stretches by N (default: the file's)
    #[arg(long = "rope-scale", value_name = "N")]
    pub scale: Option<f32>,
    /// RoPE base frequency (default: the file's)
    #[arg(long = "rope-freq-base", value_name = "N")]
    pub freq_base: Option<f32>,
    /// YaRN: the model's original context size (default: the file's, else its training context)
    #[arg(long = "yarn-orig-ctx", value_name = "N")]
    pub yarn_orig_ctx: Option<usize>,
    /// YaRN: extrapolation mix factor (default: 1 with yarn, 0 = full interpolation)
    #[arg(
        long = "yarn-ext-factor",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub yarn_ext_factor: Option<f32>,
    /// YaRN: low correction dim or beta (default: 32)
    #[arg(long = "yarn-beta-fast", value_name = "N")]
    pub yarn_beta_fast: Option<f32>,
    /// YaRN: high correction dim or alpha (default: 1)
    #[arg(long = "yarn-beta-slow", value_name = "N")]
    pub yarn_beta_slow: Option<f32>,
}

fn parse_rope_scaling(s: &str) -> Result<deltaq::model::RopeScalingType, String> {
    deltaq::model::RopeScalingType::from_name(s)
        .ok_or_else(|| format!("unknown RoPE scaling '{s}' (one of: none, linear, yarn)"))
}

impl RopeArgs {
    pub fn overrides(&self) -> deltaq::model::RopeOverrides {
        deltaq::model::RopeOverrides {
            scaling: self.scaling,
            scale: self.scale,
            freq_base: self.freq_base,
            yarn_orig_ctx: self.yarn_orig_ctx,
            yarn_ext_factor: self.yarn_ext_factor,
            yarn_beta_fast: self.yarn_beta_fast,
            yarn_beta_slow: self.yarn_beta_slow,
        }
    }

    /// Sets `model`'s RoPE from these flags over its file's settings.
    pub fn apply(&self, model: &mut deltaq::model::Model) -> anyhow::Result<()> {
        model.hp.set_rope(&self.overrides())
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every argument of every subcommand, positional ones included, and every subcommand says
    /// what it is in `--help`.
    #[test]
    fn every_argument_has_a_help_line() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                let own = id == "help" || id == "version";
                if !own && !a.is_hide_set() && a.get_help().is_none() && a.get_long_help().is_none()
                {
                    missing.push(format!("{path}: {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(format!("{sub_path} (the subcommand)"));
                }
                walk(sub, &sub_path, missing);
            }
        }
        let mut missing = Vec::new();
        let cmd = super::Cli::command();
        walk(&cmd, "deltaq", &mut missing);
        assert!(cmd.get_subcommands().count() >= 12);
        assert!(missing.is_empty(), "without a help line: {missing:#?}");
    }

    #[test]
    fn version_names_the_commit_and_kernel_table() {
        let v = super::version();
        let chosen = deltaq::kernels::kernels().isa.name();
        assert!(v.starts_with(env!("CARGO_PKG_VERSION")), "{v}");
        assert!(
            v.contains("(commit ") && v.contains(&format!("kernels: {chosen}")),
            "{v}"
        );
    }
}
