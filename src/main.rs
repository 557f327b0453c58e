//! The `deltaq` command line.

mod cli;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse_from(cli::rewrite_hf_flags(std::env::args()));
    if let Err(e) = cli::run(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
