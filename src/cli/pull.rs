//! `deltaq pull`, `deltaq list`, and the `-hf` flag of the commands that load a model.

use std::path::PathBuf;

use anyhow::{bail, Context};
use deltaq::hub::{human_bytes, Hub, ModelRef, Pulled};

#[derive(clap::Args)]
pub struct PullArgs {
    /// Model on Hugging Face: OWNER/NAME[:QUANT] (e.g. unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M; default
    /// quantization Q4_K_M, else Q8_0) or OWNER/NAME/PATH.gguf
    #[arg(value_name = "REPO[:QUANT]")]
    model: String,
    /// Skip the vision projector (mmproj) file that goes with the model
    #[arg(long)]
    no_mmproj: bool,
    /// Use the download cache only, never the network
    #[arg(long)]
    offline: bool,
}

#[derive(clap::Args)]
pub struct ListArgs {}

/// `-hf REPO[:QUANT]` for the commands that load one model.
#[derive(clap::Args, Clone, Debug)]
pub struct HubArgs {
    /// Model from Hugging Face instead of -m: OWNER/NAME[:QUANT] (e.g.
    /// unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M) or OWNER/NAME/PATH.gguf, downloaded into the cache unless
    /// it is there (also -hf, -hfr)
    #[arg(long = "hf-repo", visible_alias = "hf", value_name = "REPO[:QUANT]")]
    pub hf_repo: Option<String>,
    /// File of the --hf-repo repository to load, instead of picking one by quantization (also -hff)
    #[arg(long = "hf-file", value_name = "FILE", requires = "hf_repo")]
    pub hf_file: Option<String>,
    /// Use the download cache only, never the network (for -hf)
    #[arg(long)]
    pub offline: bool,
}

impl HubArgs {
    /// The model file `-hf` names, pulled if needed (with its mmproj when `with_mmproj`); None
    /// without `-hf`. `-m` and `-hf` together are an error.
    pub fn model_path(
        &self,
        m: Option<&PathBuf>,
        with_mmproj: bool,
    ) -> anyhow::Result<Option<PathBuf>> {
        let Some(spec) = &self.hf_repo else {
            return Ok(None);
        };
        if m.is_some() {
            bail!("give either -m FILE or -hf REPO[:QUANT], not both");
        }
        let pulled = pull_one(spec, self.hf_file.as_deref(), self.offline, with_mmproj)?;
        if let Some(p) = &pulled.mmproj {
            eprintln!("note: vision projector (mmproj): {}", p.display());
        }
        Ok(pulled.model.into_iter().next())
    }
}

/// Rewrites llama.cpp's single-dash long flags (`-hf`, `-hfr`, `-hff`) into clap's spelling;
/// `-h` stays help. Nothing after `--` is touched.
pub fn rewrite_hf_flags(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut after_dashes = false;
    args.into_iter()
        .map(|a| {
            if after_dashes {
                return a;
            }
            if a == "--" {
                after_dashes = true;
                return a;
            }
            let (flag, value) = match a.split_once('=') {
                Some((f, v)) => (f, Some(v)),
                None => (a.as_str(), None),
            };
            let long = match flag {
                "-hf" | "-hfr" => "--hf-repo",
                "-hff" => "--hf-file",
                _ => return a,
            };
            match value {
                Some(v) => format!("{long}={v}"),
                None => long.to_string(),
            }
        })
        .collect()
}

/// The model file `spec` (`REPO[:QUANT]`) names, pulled if needed, without its mmproj.
pub fn pull_model_file(spec: &str, offline: bool) -> anyhow::Result<PathBuf> {
    let pulled = pull_one(spec, None, offline, false)?;
    Ok(pulled
        .model
        .into_iter()
        .next()
        .expect("a plan has a model file"))
}

/// Resolves and downloads one model for a command that loads it: single-file GGUFs only.
fn pull_one(
    spec: &str,
    file: Option<&str>,
    offline: bool,
    with_mmproj: bool,
) -> anyhow::Result<Pulled> {
    let r = model_ref(spec, file)?;
    let hub = hub(offline)?;
    let plan = hub.plan(&r, with_mmproj)?;
    let parts = &plan.selection.model;
    if parts.len() > 1 {
        bail!(
            "{r} is split into {} files ({} ...); deltaq reads single-file GGUFs: `deltaq pull {r}` \
             downloads every part, and `llama-gguf-split --merge FIRST_PART OUT.gguf` joins them",
            parts.len(),
            parts[0].path
        );
    }
    report_plan(&hub, &plan, offline);
    Ok(hub.fetch(&plan)?)
}

fn model_ref(spec: &str, file: Option<&str>) -> anyhow::Result<ModelRef> {
    let r = ModelRef::parse(spec).map_err(anyhow::Error::msg)?;
    match file {
        None => Ok(r),
        Some(_) if r.quant.is_some() || r.file.is_some() => {
            bail!("--hf-file needs a plain OWNER/NAME as --hf-repo, not {spec}")
        }
        Some(f) => ModelRef::parse(&format!("{}/{f}", r.repo)).map_err(anyhow::Error::msg),
    }
}

fn hub(offline: bool) -> anyhow::Result<Hub> {
    let mut hub = Hub::from_env()?;
    hub.offline |= offline;
    Ok(hub)
}

/// One line on stderr about what is about to be used, and from where.
fn report_plan(hub: &Hub, plan: &deltaq::hub::Plan, offline: bool) {
    if let Some(why) = &plan.from_cache {
        if !offline && why != "offline" {
            eprintln!("note: {why}");
        }
        return;
    }
    let names: Vec<&str> = plan
        .selection
        .model
        .iter()
        .chain(plan.selection.mmproj.as_ref())
        .map(|f| f.path.as_str())
        .collect();
    eprintln!(
        "{}: {} ({}) from {}",
        plan.model_ref,
        names.join(", "),
        human_bytes(plan.total_bytes()),
        hub.endpoint()
    );
}

/// `deltaq pull`: downloads the model (and its mmproj) and prints the local paths.
pub fn run_pull(a: PullArgs) -> anyhow::Result<()> {
    let r = model_ref(&a.model, None)?;
    let hub = hub(a.offline)?;
    let plan = hub.plan(&r, !a.no_mmproj)?;
    report_plan(&hub, &plan, a.offline);
    let pulled = hub.fetch(&plan)?;
    for p in &pulled.model {
        println!("{}", p.display());
    }
    if let Some(p) = &pulled.mmproj {
        println!("{}", p.display());
    }
    Ok(())
}

/// `deltaq list`: the cached models, as a table.
pub fn run_list(_: ListArgs) -> anyhow::Result<()> {
    let hub = hub(true)?;
    let root = hub.cache().root();
    let files = hub
        .cache()
        .list()
        .with_context(|| format!("reading the cache {}", root.display()))?;
    if files.is_empty() {
        eprintln!(
            "no models in the cache ({}); get one with deltaq pull REPO[:QUANT]",
            root.display()
        );
        return Ok(());
    }
    let rows: Vec<Vec<String>> = files
        .iter()
        .map(|f| {
            vec![
                f.repo.clone(),
                f.file.path.clone(),
                deltaq::hub::quant_of(&f.file.path).unwrap_or_default(),
                human_bytes(f.file.size),
            ]
        })
        .collect();
    print!(
        "{}",
        super::table::markdown(&["repo", "file", "quant", "size"], &rows, 3)
    );
    eprintln!("cache: {}", root.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_dash_hf_flags_become_long_flags() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            rewrite_hf_flags(args(&[
                "deltaq",
                "run",
                "-hf",
                "a/b:Q8_0",
                "-hff=x.gguf",
                "-h"
            ])),
            args(&[
                "deltaq",
                "run",
                "--hf-repo",
                "a/b:Q8_0",
                "--hf-file=x.gguf",
                "-h"
            ])
        );
        assert_eq!(
            rewrite_hf_flags(args(&["deltaq", "run", "--", "-hf"])),
            args(&["deltaq", "run", "--", "-hf"])
        );
    }
}
