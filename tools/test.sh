#!/usr/bin/env bash
# The project's test command (README, CI): format, lints with warnings denied, then every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/fetch-fixtures.sh
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --release --locked
