#!/usr/bin/env bash
# Builds llama.cpp's llama-bench (and llama-quantize) from the source that PyPI's llama-cpp-python 0.3.36
# vendors (llama.cpp 0c1e57098), natively optimized, in a scratch folder that is never committed.
#
#   tools/llama-bench-build.sh [SCRATCH_DIR]
#
# SCRATCH_DIR (or $LLAMA_SCRATCH; default: target/llama-bench of this repository, which git ignores)
# receives the downloaded sdist, a Python venv (cmake, and the sdist's build backend) and the build. The
# binaries end up in SCRATCH_DIR/build/bin/; the last line printed is the llama-bench path.
#
# Environment:
#   LLAMA_CPP_PYTHON_SRC  an already extracted llama_cpp_python-0.3.36 sdist folder to build from
#                         instead of downloading it (it is only read; the build goes to SCRATCH_DIR)
#   LLAMA_TARGETS         the cmake targets to build (default: llama-bench llama-quantize), e.g. add
#                         llama-perplexity llama-mtmd-cli llama-imatrix for the comparisons
#   JOBS                  parallel compile jobs (default: the number of cores); the build runs under nice
#   LLAMA_CMAKE_ARGS      extra cmake arguments, after the defaults (they win), e.g. to build without AMX on a
#                         CPU that has it: "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
#                         -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON
#                         -DGGML_AVX512_BF16=ON"
set -euo pipefail

version=0.3.36
repo=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${LLAMA_SCRATCH:-$repo/target/llama-bench}}
mkdir -p "$scratch"
scratch=$(cd "$scratch" && pwd)
jobs=${JOBS:-$(nproc)}

if [[ -n ${LLAMA_CPP_PYTHON_SRC:-} ]]; then
    src=$LLAMA_CPP_PYTHON_SRC
else
    src=$scratch/llama_cpp_python-$version
    if [[ ! -f $src/vendor/llama.cpp/CMakeLists.txt ]]; then
        mkdir -p "$scratch/sdist"
        # pip prepares an sdist's metadata before it saves it; in an isolated build environment with
        # --no-binary :all: that compiles cmake from source first. Give it the build backend instead.
        [[ -x $scratch/venv/bin/pip ]] || python3 -m venv "$scratch/venv"
        "$scratch/venv/bin/pip" install --quiet scikit-build-core cmake
        "$scratch/venv/bin/pip" download --no-deps --no-binary :all: --no-build-isolation \
            "llama-cpp-python==$version" -d "$scratch/sdist"
        tar -xzf "$scratch/sdist/llama_cpp_python-$version.tar.gz" -C "$scratch"
    fi
fi
llama=$src/vendor/llama.cpp
if [[ ! -f $llama/CMakeLists.txt ]]; then
    echo "error: $llama has no CMakeLists.txt (not a llama-cpp-python $version source tree?)" >&2
    exit 1
fi

if command -v cmake > /dev/null; then
    cmake=cmake
else
    if [[ ! -x $scratch/venv/bin/cmake ]]; then
        python3 -m venv "$scratch/venv"
        "$scratch/venv/bin/pip" install --quiet cmake
    fi
    cmake=$scratch/venv/bin/cmake
fi

nice "$cmake" -S "$llama" -B "$scratch/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
    ${LLAMA_CMAKE_ARGS:-}
nice "$cmake" --build "$scratch/build" --config Release -j "$jobs" --target ${LLAMA_TARGETS:-llama-bench llama-quantize}
echo "built llama.cpp $(sed -n 's/^Version: //p' "$src/PKG-INFO" 2>/dev/null || echo "$version") (llama-cpp-python sdist) in $scratch/build" >&2
echo "$scratch/build/bin/llama-bench"
