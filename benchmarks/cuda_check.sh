#!/usr/bin/env bash
# edgespec on onnxruntime's CUDA execution provider, on a machine with an NVIDIA GPU:
#   1. every decoding mode's greedy tokens against the CPU provider's and, in fp16 with the KV
#      cache on the GPU, against the target's own (tests/test_cuda.py, plus the device-cache
#      and older-onnxruntime tests);
#   2. plain decoding tok/s of the SmolLM2-135M shape on the CPU provider (benchmarks.decode),
#      for the machine's record beside the tests.
# Needs onnxruntime-gpu importable by $PYTHON (default python3) and transformers + torch for
# the exports. The CUDA/cuDNN libraries of the nvidia-* pip packages next to it are put on
# the library path. Logs and JSON go to $1 (default benchmarks/results).
#
#   bash benchmarks/cuda_check.sh /tmp/cuda-results
set -uo pipefail
out=${1:-benchmarks/results}
py=${PYTHON:-python3}
mkdir -p "$out" && out=$(cd "$out" && pwd)  # absolute: the script runs from the repo root
cd "$(dirname "$0")/.."

# onnxruntime-gpu from PyPI links libcublas, libcudart, ... that the nvidia-* wheels hold
nvidia=$($py - <<'EOF'
import glob, os, site
dirs = set()
for base in site.getsitepackages():
    for lib in glob.glob(os.path.join(base, "nvidia", "**", "lib*.so*"), recursive=True):
        dirs.add(os.path.dirname(lib))
print(":".join(sorted(dirs)))
EOF
)
export LD_LIBRARY_PATH="${nvidia}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's edgespec
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $py -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
    $py -c "import edgespec.devices as d; print('edgespec devices here:', d.available())"
} 2>&1 | tee "$out/cuda_machine.txt"
if ! $py -c "import sys, edgespec.devices as d; sys.exit('cuda' not in d.available())"; then
    echo "no CUDA execution provider here: install onnxruntime-gpu (it needs the CUDA 13 and" \
        "cuDNN 9 libraries, e.g. pip install 'onnxruntime-gpu[cuda,cudnn]') on a machine with" \
        "an NVIDIA GPU" >&2
    exit 1
fi

timeout "${TEST_TIMEOUT:-300}" $py -m pytest -q -rA -p no:cacheprovider \
    tests/test_cuda.py tests/test_kv_device.py tests/test_older_onnxruntime.py \
    >"$out/cuda_tests.log" 2>&1
echo "tests: exit $? (log: $out/cuda_tests.log)"
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$out/cuda_tests.log" | tail -40

timeout "${BENCH_TIMEOUT:-400}" $py -m benchmarks.decode --shapes smollm2-135m \
    --engines edgespec --threads 4 --quiet-wait 0 --json "$out/decode.json" \
    >"$out/decode.log" 2>&1
echo "bench: exit $? (log: $out/decode.log)"
tail -12 "$out/decode.log"
