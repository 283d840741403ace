#!/usr/bin/env bash
# The GPU checks and the benchmark in one command, for a machine with CUDA GPUs:
#
#     bash benchmarks/gpu_checks.sh        # writes to $OUT if set, else to out/gpu_checks
#
# It runs the tests marked gpu (tests/test_gpu.py, and the refusal of more processes than
# GPUs in tests/test_proofs.py), then the benchmark with 3 rounds, and keeps what they print.
# PYTHON picks the interpreter (default: .venv/bin/python).
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
out=${OUT:-out/gpu_checks}
if ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "gpu_checks.sh: PyTorch sees no CUDA GPU here; the CPU tests are: $python -m pytest" >&2
    exit 1
fi
mkdir -p "$out"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1

"$python" -m pytest -v -m gpu 2>&1 | tee "$out/gpu_tests.txt"
tests=${PIPESTATUS[0]}
"$python" benchmarks/benchmark.py --repeats 3 --json "$out/benchmark.json" 2>&1 | tee "$out/benchmark.txt"
benchmark=${PIPESTATUS[0]}

echo "gpu_checks.sh: tests exited $tests, benchmark $benchmark; outputs in $out"
[ "$tests" -eq 0 ] && [ "$benchmark" -eq 0 ]
