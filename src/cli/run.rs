use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use deltaq::chat::{ChatMessage, ChatTemplate, Part, ThinkStream};
use deltaq::constraint::{Compiler, Guide, OutputConstraint};
use deltaq::generate::{generate, generate_prompt, Chat, Stats, Stop};
use deltaq::gguf::GgufFile;
use deltaq::model::prompt::image_chat_prompt;
use deltaq::model::{Drafter, ImageEmbd, KvType, Model, Prompt, Session};
use deltaq::sampling::{Sampler, SamplingParams};
use deltaq::tokenizer::Tokenizer;
use deltaq::vision::encoder::ImageEncoder;

/// The bundled demo model, used when `-m` is not given.
const DEMO_MODEL: &str = "models/tiny-kjv-mtp-Q8_0.gguf";

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model file (default: the bundled demo model; -hf downloads one)
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
    /// Prompt; without it, an interactive chat starts
    #[arg(short = 'p', long)]
    prompt: Option<String>,
    /// File holding the prompt (UTF-8; one trailing newline is dropped, as llama.cpp's -f)
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "prompt"
    )]
    file: Option<PathBuf>,
    /// Continue the prompt as plain text instead of wrapping it in the chat template
    #[arg(long)]
    raw: bool,
    /// Tokens to generate (-1: until end of text or a full context)
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Context size in tokens (default: the model's training context)
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Threads (default: all cores)
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// KV cache type for keys and values: f16 (as llama.cpp), f32 (exact), q8_0 or q4_0 (blocks of 32)
    #[arg(long = "kv-type", value_name = "TYPE", default_value = "f16", value_parser = super::parse_kv_type)]
    kv_type: KvType,
    /// Temperature (0: greedy)
    #[arg(long)]
    temp: Option<f32>,
    /// Sample only from the K most likely tokens (0: all; default 20, the model card's)
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample from the most likely tokens whose probabilities add up to P (default: 0.95 thinking, 0.8 not)
    #[arg(long)]
    top_p: Option<f32>,
    /// Drop tokens less likely than P times the most likely one (default 0: off)
    #[arg(long)]
    min_p: Option<f32>,
    /// Subtract P from the logit of every token already in the last --repeat-last-n (default: 1.5 in
    /// chat, 0 with --raw)
    #[arg(long)]
    presence_penalty: Option<f32>,
    /// Subtract P times its count from the logit of every token in the last --repeat-last-n (default 0)
    #[arg(long)]
    frequency_penalty: Option<f32>,
    /// Penalize tokens in the last --repeat-last-n by P, as llama.cpp's --repeat-penalty (default 1: off)
    #[arg(long = "repeat-penalty")]
    repeat_penalty: Option<f32>,
    /// Tokens the penalties look back over
    #[arg(long = "repeat-last-n")]
    repeat_last_n: Option<usize>,
    /// Random seed (default: different every run)
    #[arg(short = 's', long)]
    seed: Option<u64>,
    /// Turn thinking off (the chat template's enable_thinking=false)
    #[arg(long)]
    no_think: bool,
    /// Do not print the model's thinking
    #[arg(long)]
    hide_think: bool,
    /// System message for chat
    #[arg(long)]
    system: Option<String>,
    /// Constrain the answer to a GBNF grammar (llama.cpp's syntax)
    #[arg(long, value_name = "GBNF", conflicts_with_all = ["grammar_file", "json_schema"])]
    grammar: Option<String>,
    /// Constrain the answer to the GBNF grammar in FILE
    #[arg(long, value_name = "FILE", conflicts_with = "json_schema")]
    grammar_file: Option<PathBuf>,
    /// Constrain the answer to a JSON schema: the schema's text, or @FILE
    #[arg(short = 'j', long, value_name = "SCHEMA")]
    json_schema: Option<String>,
    #[command(flatten)]
    draft: super::DraftArgs,
    #[command(flatten)]
    rope: super::RopeArgs,
    #[command(flatten)]
    hub: super::pull::HubArgs,
    #[command(flatten)]
    images: super::ImageArgs,
}

pub fn run(mut a: Args) -> anyhow::Result<()> {
    if let Some(file) = &a.file {
        a.prompt = Some(read_prompt_file(file)?);
    }
    if a.prompt.as_deref().is_some_and(|p| p.trim().is_empty()) {
        bail!(
            "the prompt is empty: give some text with -p, or leave -p out for an interactive chat"
        );
    }
    let path = match a.hub.model_path(a.model.as_ref(), true)? {
        Some(p) => p,
        None => match &a.model {
            Some(p) => p.clone(),
            None => demo_model()?,
        },
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.unwrap_or(0))
        .build()?;
    let f = GgufFile::open(&path)?;
    let mut model = Model::load(&f).with_context(|| format!("loading {}", path.display()))?;
    a.rope.apply(&mut model)?;
    model.hp.check_kv_type(a.kv_type)?;
    let tok =
        Tokenizer::from_gguf(&f).with_context(|| format!("tokenizer of {}", path.display()))?;
    if let Some(c) = a.ctx_size {
        model.hp.check_ctx(c)?;
    }
    let constraint = RunConstraint::from_args(&a, &tok, model.n_vocab())?;
    let constraint = constraint.as_ref();
    let params = sampling(&a);
    let max_new = (a.n_predict >= 0).then_some(a.n_predict as usize);
    let interrupt = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupt.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed))
            .context("installing the Ctrl-C handler")?;
    }
    let template = if a.raw {
        None
    } else {
        match ChatTemplate::from_gguf(&f) {
            Ok(t) => Some(t),
            Err(e) if a.prompt.is_some() => {
                eprintln!(
                    "note: no usable chat template ({e}); continuing the prompt as plain text"
                );
                None
            }
            Err(e) => bail!(
                "{} has no usable chat template ({e}), and an interactive chat needs one: give a \
                 prompt with -p to continue it as plain text (--raw)",
                path.display()
            ),
        }
    };
    f.release_metadata_pages();
    let drafter = a.draft.drafter(&model);
    let mut out = Printer::new(!a.hide_think);
    let mmproj = a.images.open_mmproj()?;
    let encoder = match &mmproj {
        Some(f) => Some(a.images.encoder(f, model.hp.n_embd)?),
        None => None,
    };
    if let (Some(enc), false) = (&encoder, a.images.image.is_empty()) {
        let Some(p) = &a.prompt else {
            bail!("--image needs a prompt (-p)");
        };
        if a.raw || a.system.is_some() {
            bail!("--image takes a one-turn chat prompt: --raw and --system do not go with it");
        }
        return pool.install(|| -> anyhow::Result<()> {
            let images = super::encode_image_files(enc, &a.images.image)?;
            let prompt = image_chat_prompt(&tok, p, images)?;
            let mut session = Session::with_kv_type(&model, a.ctx_size, a.kv_type);
            let mut dr = Drafter::off();
            let mut sampler = Sampler::new(params);
            let stats = reply(
                &mut out,
                &mut session,
                &tok,
                &mut sampler,
                &mut dr,
                Feed::Prompt(&prompt, 0),
                max_new,
                false,
                constraint,
                &interrupt,
            )?;
            report(&stats, false);
            Ok(())
        });
    }
    pool.install(|| -> anyhow::Result<()> {
        match (&a.prompt, template) {
            (Some(p), None) => {
                let ids = tok.encode(p, true)?;
                if ids.is_empty() {
                    bail!("the prompt is empty");
                }
                let mut session = Session::with_kv_type(&model, a.ctx_size, a.kv_type);
                if drafter.is_some() {
                    session.enable_mtp()?;
                }
                let mut dr = drafter.clone().unwrap_or_else(Drafter::off);
                let mut sampler = Sampler::new(params);
                print!("{p}");
                let mut guide = constraint.map(|c| c.guide(&ids)).transpose()?;
                let stats = generate(
                    &mut session,
                    &tok,
                    &mut sampler,
                    &mut dr,
                    &ids,
                    max_new,
                    false,
                    guide.as_mut(),
                    &interrupt,
                    &mut |t| out.raw(t),
                )?;
                println!();
                report(&stats, drafter.is_some());
            }
            (Some(p), Some(tmpl)) => {
                let mut chat = Chat::new(&model, a.ctx_size, tmpl);
                chat.kv_type = a.kv_type;
                chat.mtp = drafter.is_some();
                if let Some(s) = &a.system {
                    chat.messages.push(ChatMessage::system(s));
                }
                chat.enable_thinking = a.no_think.then_some(false);
                let (mut session, gen) = chat.prepare(&tok, p)?;
                let mut sampler = Sampler::new(params);
                let mut dr = drafter.clone().unwrap_or_else(Drafter::off);
                let stats = reply(
                    &mut out,
                    &mut session,
                    &tok,
                    &mut sampler,
                    &mut dr,
                    Feed::Tokens(&gen),
                    max_new,
                    !a.no_think,
                    constraint,
                    &interrupt,
                )?;
                report(&stats, drafter.is_some());
            }
            (None, Some(tmpl)) => interactive(
                &a,
                &model,
                &tok,
                tmpl,
                params,
                drafter,
                max_new,
                constraint,
                &interrupt,
                &mut out,
                encoder.as_ref(),
            )?,
            (None, None) => unreachable!("a missing template is an error without a prompt"),
        }
        Ok(())
    })
}

/// The prompt in `path`, without one trailing newline (llama.cpp's `-f` drops it too).
fn read_prompt_file(path: &std::path::Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the prompt file {}", path.display()))?;
    let mut text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "the prompt file {} is not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

/// `--grammar`, `--grammar-file`, `--json-schema`: the answer's constraint, with the vocabulary it
/// is compiled against for each reply.
struct RunConstraint {
    compiler: Compiler,
    constraint: OutputConstraint,
}

impl RunConstraint {
    fn from_args(a: &Args, tok: &Tokenizer, n_vocab: usize) -> anyhow::Result<Option<Self>> {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let constraint = if let Some(g) = &a.grammar {
            OutputConstraint::Grammar(g.clone())
        } else if let Some(f) = &a.grammar_file {
            OutputConstraint::Grammar(read(f)?)
        } else if let Some(j) = &a.json_schema {
            let text = match j.strip_prefix('@') {
                Some(f) => read(std::path::Path::new(f))?,
                None => j.clone(),
            };
            let schema = serde_json::from_str(&text).context("--json-schema is not valid JSON")?;
            OutputConstraint::JsonSchema(schema)
        } else {
            return Ok(None);
        };
        let compiler = Compiler::new(tok, n_vocab)?;
        // Compile once now: a bad grammar or schema is reported before the model runs.
        compiler.compile(&constraint)?;
        Ok(Some(RunConstraint {
            compiler,
            constraint,
        }))
    }

    /// The guide of one reply to `prompt` (free thinking first if the prompt opens a think block).
    fn guide(&self, prompt: &[u32]) -> anyhow::Result<Guide> {
        let mut g = self.compiler.compile(&self.constraint)?;
        if self.compiler.starts_in_thinking(prompt) {
            g.wait_for_thinking();
        }
        Ok(g)
    }
}

fn demo_model() -> anyhow::Result<PathBuf> {
    let candidates = [
        PathBuf::from(DEMO_MODEL),
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(DEMO_MODEL),
    ];
    candidates
        .into_iter()
        .find(|p| p.exists())
        .with_context(|| format!("no -m given and the demo model {DEMO_MODEL} was not found"))
}

fn sampling(a: &Args) -> SamplingParams {
    let mut p = SamplingParams::qwen35(!a.no_think);
    if a.raw || a.prompt.is_some() && a.model.is_none() {
        // A base model continuing text: the chat defaults' presence penalty is meant for instruct use.
        p.presence_penalty = 0.0;
    }
    p.temperature = a.temp.unwrap_or(p.temperature);
    p.top_k = a.top_k.unwrap_or(p.top_k);
    p.top_p = a.top_p.unwrap_or(p.top_p);
    p.min_p = a.min_p.unwrap_or(p.min_p);
    p.presence_penalty = a.presence_penalty.unwrap_or(p.presence_penalty);
    p.frequency_penalty = a.frequency_penalty.unwrap_or(p.frequency_penalty);
    p.repeat_penalty = a.repeat_penalty.unwrap_or(p.repeat_penalty);
    p.penalty_last_n = a.repeat_last_n.unwrap_or(p.penalty_last_n);
    p.seed = a.seed;
    p
}

/// What a reply feeds before generating: the continuation's tokens, or tokens `start..` of a prompt
/// with images.
enum Feed<'p> {
    Tokens(&'p [u32]),
    Prompt(&'p Prompt, usize),
}

/// Streams one assistant reply: thinking (dimmed on a terminal, or hidden) then the answer.
#[allow(clippy::too_many_arguments)]
fn reply(
    out: &mut Printer,
    session: &mut Session<'_>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    drafter: &mut Drafter,
    prompt: Feed<'_>,
    max_new: Option<usize>,
    thinking: bool,
    constraint: Option<&RunConstraint>,
    interrupt: &AtomicBool,
) -> anyhow::Result<Stats> {
    let tokens = match prompt {
        Feed::Tokens(ids) => ids,
        Feed::Prompt(p, _) => p.tokens(),
    };
    let mut guide = constraint.map(|c| c.guide(tokens)).transpose()?;
    // With thinking on, the generation prompt ends inside `<think>`.
    let mut split = ThinkStream::new(thinking);
    let mut on_text = |t: &str| {
        for (part, text) in split.push(t) {
            out.part(part, &text);
        }
    };
    let stats = match prompt {
        Feed::Tokens(ids) => generate(
            session,
            tok,
            sampler,
            drafter,
            ids,
            max_new,
            true,
            guide.as_mut(),
            interrupt,
            &mut on_text,
        )?,
        Feed::Prompt(p, start) => generate_prompt(
            session,
            tok,
            sampler,
            drafter,
            p,
            start,
            max_new,
            true,
            guide.as_mut(),
            interrupt,
            &mut on_text,
        )?,
    };
    for (part, text) in split.finish() {
        out.part(part, &text);
    }
    out.end_line();
    Ok(stats)
}

#[allow(clippy::too_many_arguments)]
fn interactive(
    a: &Args,
    model: &Model<'_>,
    tok: &Tokenizer,
    tmpl: ChatTemplate,
    params: SamplingParams,
    drafter: Option<Drafter>,
    max_new: Option<usize>,
    constraint: Option<&RunConstraint>,
    interrupt: &AtomicBool,
    out: &mut Printer,
    encoder: Option<&ImageEncoder<'_>>,
) -> anyhow::Result<()> {
    let mut chat = Chat::new(model, a.ctx_size, tmpl);
    let mut attached: Vec<Arc<ImageEmbd>> = Vec::new();
    chat.kv_type = a.kv_type;
    chat.mtp = drafter.is_some();
    if let Some(s) = &a.system {
        chat.messages.push(ChatMessage::system(s));
    }
    chat.enable_thinking = a.no_think.then_some(false);
    let mut sampler = Sampler::new(params);
    eprintln!(
        "chat with {} (Ctrl-C stops an answer, Ctrl-D exits{})",
        model_name(a),
        if encoder.is_some() {
            ", /image FILE attaches an image to the next message"
        } else {
            ""
        }
    );
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        eprint!("> ");
        line.clear();
        interrupt.store(false, Ordering::Relaxed);
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(());
        }
        let user = line.trim_end_matches(['\n', '\r']);
        if user.trim().is_empty() {
            continue;
        }
        if let Some(file) = user.strip_prefix("/image ") {
            let Some(enc) = encoder else {
                eprintln!("error: /image needs --mmproj (the model's vision tower file)");
                continue;
            };
            match super::encode_image_files(enc, &[PathBuf::from(file.trim())]) {
                Ok(mut im) => {
                    attached.append(&mut im);
                    eprintln!("{} image(s) attached to the next message", attached.len());
                }
                Err(e) => eprintln!("error: {e:#}"),
            }
            continue;
        }
        out.start_capture();
        let mut dr = drafter.clone().unwrap_or_else(Drafter::off);
        let stats = if attached.is_empty() && !chat.has_images() {
            let (mut session, gen) = chat.prepare(tok, user)?;
            reply(
                out,
                &mut session,
                tok,
                &mut sampler,
                &mut dr,
                Feed::Tokens(&gen),
                max_new,
                !a.no_think,
                constraint,
                interrupt,
            )?
        } else {
            let (mut session, prompt, start) =
                match chat.prepare_images(tok, user, std::mem::take(&mut attached)) {
                    Ok(p) => p,
                    Err(e) => {
                        out.take_capture();
                        eprintln!("error: {e:#}");
                        continue;
                    }
                };
            reply(
                out,
                &mut session,
                tok,
                &mut sampler,
                &mut dr,
                Feed::Prompt(&prompt, start),
                max_new,
                !a.no_think,
                constraint,
                interrupt,
            )?
        };
        let (thinking, answer) = out.take_capture();
        chat.add_reply(answer.trim(), &thinking);
        if stats.stop == Stop::Interrupted {
            eprintln!("[stopped]");
        }
        report(&stats, drafter.is_some());
    }
}

fn model_name(a: &Args) -> String {
    a.model
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| format!("the demo model ({DEMO_MODEL})"))
}

fn report(s: &Stats, drafting: bool) {
    let why = match s.stop {
        Stop::EndOfText => "end of text",
        Stop::Length => "token limit",
        Stop::Context => "context full",
        Stop::Interrupted => "interrupted",
    };
    eprintln!(
        "\nprompt: {} tokens, {:.1} tokens/s | generation: {} tokens, {:.1} tokens/s | stopped: {why}",
        s.prompt_tokens,
        s.prompt_tps(),
        s.gen_tokens,
        s.gen_tps()
    );
    if drafting {
        let d = &s.draft;
        eprintln!(
            "draft tokens: {} proposed, {} accepted ({:.1} %)",
            d.proposed,
            d.accepted,
            100.0 * d.acceptance()
        );
    }
}

/// Writes streamed text to stdout: thinking dimmed on a terminal (or in `<think>` tags when piped), or
/// not at all; optionally keeps a copy of the turn for the chat history.
struct Printer {
    show_thinking: bool,
    tty: bool,
    in_thinking: bool,
    capture: Option<(String, String)>,
}

impl Printer {
    fn new(show_thinking: bool) -> Printer {
        Printer {
            show_thinking,
            tty: std::io::stdout().is_terminal(),
            in_thinking: false,
            capture: None,
        }
    }

    fn raw(&mut self, text: &str) {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(text.as_bytes());
        let _ = o.flush();
    }

    fn part(&mut self, part: Part, text: &str) {
        if let Some((thinking, answer)) = &mut self.capture {
            match part {
                Part::Thinking => thinking.push_str(text),
                Part::Answer => answer.push_str(text),
            }
        }
        if part == Part::Thinking && !self.show_thinking {
            return;
        }
        let mut s = String::new();
        match (part, self.in_thinking) {
            (Part::Thinking, false) => {
                s.push_str(if self.tty { "\x1b[2m" } else { "<think>\n" });
                self.in_thinking = true;
            }
            (Part::Answer, true) => {
                s.push_str(if self.tty {
                    "\x1b[0m\n"
                } else {
                    "\n</think>\n\n"
                });
                self.in_thinking = false;
            }
            _ => {}
        }
        s.push_str(text);
        self.raw(&s);
    }

    fn end_line(&mut self) {
        if self.in_thinking {
            let close = if self.tty { "\x1b[0m" } else { "\n</think>" };
            self.raw(close);
            self.in_thinking = false;
        }
        self.raw("\n");
    }

    fn start_capture(&mut self) {
        self.capture = Some((String::new(), String::new()));
    }

    fn take_capture(&mut self) -> (String, String) {
        self.capture.take().unwrap_or_default()
    }
}
