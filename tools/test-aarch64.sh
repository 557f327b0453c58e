#!/usr/bin/env bash
# Cross-compiles deltaq for aarch64 (the Raspberry Pi 5's Cortex-A76) and runs its tests under qemu user
# emulation, on an x86-64 Debian machine:
#   1. installs the cross toolchain if it is missing (Debian's Rust with an aarch64 standard library, the
#      aarch64 C toolchain, qemu-user-static; needs root or sudo, and only once);
#   2. builds the tests with clippy -D warnings (the NEON code is compiled out on x86-64, so x86 clippy
#      never sees it);
#   3. as a Cortex-A76 (NEON + dotprod, no i8mm: a Pi 5): the library unit tests and the kernel/model tests;
#   4. as a Cortex-A53 (NEON, no dotprod: a Pi 3): the kernel and quantization tests again, on the plain
#      NEON path.
# Prints PASS/FAIL per step and exits non-zero on the first failure. Emulation is 10-50x slower than
# native, so the emulated set is kept small; timings under emulation mean nothing.
# Environment: CARGO_TARGET_DIR (default target/), DELTAQ_AARCH64_CLIPPY=0 to build without clippy.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
target=aarch64-unknown-linux-gnu
packages=(rustc-web cargo-web libstd-rust-web-dev:arm64 rust-web-clippy
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)

say() { echo "test-aarch64: $* ($(($(date +%s) - start)) s)"; }
fail() {
  say "FAIL: $*"
  exit 1
}

# --- 1. toolchain -------------------------------------------------------------------------------------
have_toolchain() {
  [ -x /usr/bin/rustc ] && [ -x /usr/bin/cargo ] && [ -x /usr/bin/clippy-driver ] &&
    [ -d "$(/usr/bin/rustc --print sysroot)/lib/rustlib/$target/lib" ] &&
    command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64-static >/dev/null
}
if ! have_toolchain; then
  say "installing the aarch64 cross toolchain"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || fail "not root and no sudo: install ${packages[*]} (arch arm64 enabled)"
    sudo=(sudo)
  fi
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${sudo[@]}" dpkg --add-architecture arm64
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null
  have_toolchain || fail "toolchain still incomplete after apt-get install"
  say "toolchain installed"
fi

# Debian's Rust (/usr/bin) has the aarch64 standard library; the rustup toolchain does not.
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# Static: dynamically linked test binaries hang under qemu once they spawn a thread.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"
# Debug info only slows the cross build down.
export CARGO_PROFILE_RELEASE_DEBUG=0
# Clippy with warnings denied, in the same (release) build as the tests rather than a separate check
# build of every dependency: Debian's clippy-driver compiles this crate (dependencies stay plain rustc).
if [ "${DELTAQ_AARCH64_CLIPPY:-1}" != 0 ]; then
  export RUSTC_WORKSPACE_WRAPPER=/usr/bin/clippy-driver
  export CLIPPY_ARGS="-Dwarnings__CLIPPY_HACKERY__"
fi
export CARGO_TERM_COLOR=never
cargo=(/usr/bin/cargo)

# Integration tests run under emulation: the kernels against scalar, the model against its golden logits
# (every matmul through the best NEON table). Missing files are skipped.
a76_tests=()
for t in kernels_match_scalar model_golden mtp; do
  [ -f "tests/$t.rs" ] && a76_tests+=(--test "$t")
done
a53_tests=()
[ -f tests/kernels_match_scalar.rs ] && a53_tests+=(--test kernels_match_scalar)
# Skipped under emulation: the slow batching-consistency tests (model logic, not kernels), and tests that
# re-run the test binary as a child process unless they start it through DELTAQ_TEST_RUNNER (qemu-user
# cannot exec an aarch64 binary by itself: there is no binfmt_misc here).
skips=(--skip batching_is_consistent)
# tests/mtp.rs: the short drafting test and the golden chains; the long runs are x86-only.
skips+=(--skip speculative_greedy_equals_plain --skip teacher_forced_logits --skip chained_drafts)
if ! grep -qs DELTAQ_TEST_RUNNER tests/kernels_match_scalar.rs; then
  skips+=(--skip deltaq_isa_forces_a_table --skip model_logits_same_with_every_isa)
fi

# --- 2.-4. build with clippy, tests under emulation ---------------------------------------------------
bash tools/fetch-fixtures.sh # the model tests' reference files (a no-op when they are current)
"${cargo[@]}" test --release --locked --target "$target" --no-run --lib "${a76_tests[@]}" ||
  fail "aarch64 build (clippy -D warnings)"
say "PASS aarch64 build, clippy -D warnings"

run() { # run CPU EXPECT_DOTPROD CARGO-TEST-ARGS... -- TEST-ARGS...: cargo test under qemu as CPU
  local cpu=$1 dotprod=$2
  shift 2
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -cpu $cpu" \
    DELTAQ_TEST_RUNNER="qemu-aarch64-static -cpu $cpu" \
    DELTAQ_TEST_EXPECT_DOTPROD=$dotprod \
    "${cargo[@]}" test --release --locked --target "$target" "$@"
}

run cortex-a76 1 --lib "${a76_tests[@]}" -- "${skips[@]}" ||
  fail "tests as cortex-a76 (NEON + dotprod)"
say "PASS tests as cortex-a76 (NEON + dotprod): lib ${a76_tests[*]}"

run cortex-a53 0 --lib -- kernels:: quant:: || fail "kernel tests as cortex-a53 (plain NEON)"
if [ ${#a53_tests[@]} -gt 0 ]; then
  run cortex-a53 0 "${a53_tests[@]}" -- "${skips[@]}" ||
    fail "kernel tests as cortex-a53 (plain NEON)"
fi
say "PASS kernel tests as cortex-a53 (plain NEON)"

say "PASS"
