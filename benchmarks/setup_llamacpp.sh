#!/usr/bin/env bash
# Build llama.cpp from source, in its own venv, for the llama.cpp rows of benchmarks.decode and benchmarks.quant.
#
# Takes: VENV (default /work/venv-llamacpp), SRC (default /work/llamacpp-src), JOBS (default 2),
#        AMX (default off; "on" builds llama.cpp's AMX kernels, for hosts where they run).
# Guarantees, when it exits 0:
#   $VENV/bin/python           has torch==2.13.0 (CPU), transformers, gguf, numpy, sentencepiece and
#                              the `llama_cpp` Python package (ctypes bindings, no compiled code);
#   $SRC/build/bin/            llama-quantize, llama-bench, llama-speculative(-simple), llama-lookup,
#                              llama-simple, llama-server and libllama.so, built with cmake from the llama.cpp tree
#                              vendored in the llama-cpp-python source distribution (never a binary
#                              wheel or a downloaded executable);
#   $SRC/llama.cpp             a link to that vendored tree (convert_hf_to_gguf.py lives there);
#   $VENV/llamacpp.env         LLAMA_CPP_LIB_PATH / LLAMACPP_BIN / LLAMACPP_TREE to source.
# The bindings load $SRC/build/bin/libllama.so through LLAMA_CPP_LIB_PATH, so the library the Python
# rows use and the tools the CLI rows use are the same build. Reruns skip finished steps.
set -euo pipefail
VENV=${VENV:-/work/venv-llamacpp}
SRC=${SRC:-/work/llamacpp-src}
JOBS=${JOBS:-2}

mkdir -p "$SRC"
cd "$SRC"
if ! ls llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    # The source distribution, never a wheel. Only this package: with --no-binary :all: pip
    # builds the sdist's build backends (scikit-build-core, cmake, ...) from source too, for hours.
    python3 -m pip download --no-binary llama-cpp-python --no-deps llama-cpp-python -d .
fi
SDIST=$(ls llama_cpp_python-*.tar.gz | sort -V | tail -1)
PKG=${SDIST%.tar.gz}
[ -d "$PKG" ] || tar xzf "$SDIST"
ln -sfn "$SRC/$PKG/vendor/llama.cpp" "$SRC/llama.cpp"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# torch first with the pin (a bare `torch` would pull CUDA wheels); the converter imports it.
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q numpy transformers sentencepiece safetensors diskcache jinja2 "$SRC/llama.cpp/gguf-py"
# The bindings without their bundled build (LLAMA_BUILD=OFF): the library comes from our cmake build.
if ! "$VENV/bin/python" -c "import llama_cpp" >/dev/null 2>&1; then
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF" \
        "$VENV/bin/pip" install -q --no-deps "$SRC/$PKG" || true
fi

# Native build of the vendored tree: shared libllama + the tools the benchmarks call.
# AMX stays off unless AMX=on: a VM may list amx_* in /proc/cpuinfo without letting a process
# use the tiles (this project's Xeon VM: llama.cpp's Q8_0/Q4_0 prompt path died with a general
# protection fault and SIGILL in libggml-cpu). Where the tiles do run, the AMX build decoded
# Q8_0/Q4_0 about twice as fast as this one: build it with AMX=on.
AMX_FLAGS=""
if [ "${AMX:-off}" != on ]; then
    AMX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
cmake -S "$SRC/llama.cpp" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
    -DCMAKE_C_FLAGS="$AMX_FLAGS" -DCMAKE_CXX_FLAGS="$AMX_FLAGS" >/dev/null
cmake --build "$SRC/build" -j "$JOBS" --target llama llama-quantize llama-bench llama-speculative \
    llama-speculative-simple llama-lookup llama-simple llama-server

cat >"$VENV/llamacpp.env" <<EOF
export LLAMA_CPP_LIB_PATH=$SRC/build/bin
export LLAMACPP_BIN=$SRC/build/bin
export LLAMACPP_TREE=$SRC/llama.cpp
EOF
LLAMA_CPP_LIB_PATH=$SRC/build/bin "$VENV/bin/python" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)"
ls "$SRC/build/bin"
