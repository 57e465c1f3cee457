#!/usr/bin/env bash
# Builds llama.cpp from the source vendored in the llama-cpp-python==0.3.36 sdist, outside the repo.
#
#   bash experiments/peers/build_llama_cpp.sh            # -> $SPECJAX_PEERS/llama.cpp/build/bin
#
# Only the tools the peers benchmark and the quantisation probe use are built (llama-bench,
# llama-completion, llama-lookup, llama-quantize, llama-perplexity), CPU only, tuned for this
# machine (GGML_NATIVE). About 6-10 minutes on 2 cores.
# Idempotent: a finished build is reused.
set -euo pipefail
PEERS="${SPECJAX_PEERS:-$HOME/.cache/specjax-peers}"
VERSION=0.3.36
mkdir -p "$PEERS"
cd "$PEERS"
BIN="$PEERS/llama.cpp/build/bin"
if [[ -x "$BIN/llama-bench" && -x "$BIN/llama-completion" && -x "$BIN/llama-lookup" && -x "$BIN/llama-quantize" && -x "$BIN/llama-perplexity" ]]; then
  echo "llama.cpp already built: $BIN"; exit 0
fi
if [[ ! -f "llama_cpp_python-$VERSION.tar.gz" ]]; then
  pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .
fi
if [[ ! -d llama.cpp ]]; then
  tar xzf "llama_cpp_python-$VERSION.tar.gz"
  mv "llama_cpp_python-$VERSION/vendor/llama.cpp" llama.cpp
  rm -rf "llama_cpp_python-$VERSION"
fi
cmake -S llama.cpp -B llama.cpp/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DGGML_OPENMP=ON
cmake --build llama.cpp/build -j"$(nproc)" \
  --target llama-bench llama-completion llama-lookup llama-quantize llama-perplexity
ls -la "$BIN"
