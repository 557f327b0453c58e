//! The `deltaq` command line.

mod cli;

use clap::{CommandFactory, FromArgMatches};

fn main() {
    // `--version` names the kernel table, which is chosen at run time on this CPU
    let version: &'static str = Box::leak(cli::version().into_boxed_str());
    let matches = cli::Cli::command()
        .version(version)
        .get_matches_from(cli::rewrite_hf_flags(std::env::args()));
    let args = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = cli::run(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
