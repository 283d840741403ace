#!/usr/bin/env bash
# The GPU checks and the benchmark in one command, for a fresh machine with CUDA GPUs:
#
#     bash benchmarks/gpu_checks.sh        # writes to $OUT if set, else to out/gpu_checks
#
# Made for a lent machine's short window: every stage has a time limit, and the whole run
# ends within about 12 minutes on one GPU, most of it measuring. In order:
#   1. what it runs on, to environment.txt: Python, torch, CUDA, NCCL, the GPUs, nvidia-smi;
#   2. stop if torch cannot be imported; if it is not the torch requirements.txt pins, say so
#      and go on: the code must work on the torch the machine has, and the figures name it;
#   3. collect the tests marked gpu, to gpu_tests_collected.txt: an error stops it here;
#   4. stop if torch sees no GPU;
#   5. the tests marked gpu (tests/test_gpu.py, and the refusal of more processes than GPUs
#      in tests/test_proofs.py), to gpu_tests.txt;
#   6. DDP in time: benchmarks/buckets.py, train_ddp.py --profile at the large regime (2 GPUs where
#      there are 2, else 1) at each bucket size, to buckets.txt, and to buckets/: each run's
#      traces (open them in ui.perfetto.dev), their timeline.png, and buckets.json;
#   7. the benchmark, its rounds while they fit its budget, to benchmark.txt, and
#      benchmark.json, written after every run, so that a hang still returns what was measured;
#   8. a hang on nccl, under PyTorch's tools (TORCH_DISTRIBUTED_DEBUG=DETAIL, monitored_barrier,
#      the Flight Recorder and its analyser): benchmarks/hang_tools.py --backend nccl, to
#      hangs_nccl.txt and hangs_nccl.json, where there are 2 GPUs (nccl puts a rank on each).
#   9. FSDP2's memory: benchmarks/memory.py on the GPUs (2 and 4 where there are as many, else 1),
#      each rank's peak of a training step by torch's memory tracker and by the allocator
#      (torch.cuda.max_memory_allocated), DDP's beside it, to memory.txt and memory.json.
# The interpreter: $PYTHON if set, else .venv/bin/python if there is one, else python3 (a
# GPU machine's own, with torch, pytest and matplotlib, where nothing can be installed).
# tests/test_gpu_checks.py runs this on a CPU as such a machine would, up to step 4.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out/gpu_checks}
collect_limit=60 tests_limit=150 buckets_limit=150 benchmark_budget=240 benchmark_limit=270 # seconds
hangs_limit=120 memory_limit=90 # seconds, stages 8 and 9
if [ -n "${PYTHON:-}" ]; then
    python=$PYTHON
elif [ -x .venv/bin/python ]; then
    python=.venv/bin/python
else
    python=python3
fi
export PYTHONUNBUFFERED=1 # what a stage printed reaches its file, even when its time runs out
say() { echo "gpu_checks.sh: $*" >&2; }
mkdir -p "$out"

# 1. what it runs on
"$python" benchmarks/environment.py >"$out/environment.txt" 2>&1
say "what this machine runs: $out/environment.txt"

# 2. torch
if ! found=$("$python" -c 'import torch; print(torch.__version__, torch.cuda.device_count())' 2>/dev/null); then
    say "stopped: $python cannot import torch (see $out/environment.txt); run it with a Python" \
        "that has torch, pytest and matplotlib: PYTHON=/path/to/python bash $0"
    exit 1
fi
read -r torch gpus <<<"$found"
pinned=$(sed -n 's/^torch==//p' requirements.txt)
if [ "${torch%%+*}" != "$pinned" ]; then
    say "torch $torch is not the $pinned that requirements.txt pins: going on with it; the figures name it"
fi

# 3. the GPU tests, collected
timeout -k 10 "$collect_limit" "$python" -m pytest -m gpu --collect-only -q >"$out/gpu_tests_collected.txt" 2>&1
collected=$?
if [ "$collected" -ne 0 ]; then
    tail -n 20 "$out/gpu_tests_collected.txt" >&2
    say "stopped: collecting the GPU tests failed (pytest exit $collected): $out/gpu_tests_collected.txt"
    exit 1
fi
say "the GPU tests: $(tail -n 1 "$out/gpu_tests_collected.txt")"

# 4. a GPU
if [ "$gpus" -eq 0 ]; then
    say "stopped: no GPU here (torch $torch sees no CUDA device), so nothing ran on one;" \
        "the GPU tests were collected. The CPU tests are: $python -m pytest"
    exit 1
fi

# 5. the GPU tests
timeout -k 15 "$tests_limit" "$python" -m pytest -v -m gpu --durations=10 2>&1 | tee "$out/gpu_tests.txt"
tests=${PIPESTATUS[0]}
[ "$tests" -eq 124 ] && say "the GPU tests ran past their $tests_limit s and were stopped"

# 6. DDP in time: a trace per process, at each bucket size, and their timeline
timeout -k 15 "$buckets_limit" "$python" benchmarks/buckets.py --regime large --repeats 1 --out "$out/buckets" \
    2>&1 | tee "$out/buckets.txt"
buckets=${PIPESTATUS[0]}
[ "$buckets" -eq 124 ] && say "the traces ran past their $buckets_limit s and were stopped"

# 7. the benchmark
timeout -k 15 "$benchmark_limit" "$python" benchmarks/benchmark.py --repeats 3 --budget "$benchmark_budget" \
    --json "$out/benchmark.json" 2>&1 | tee "$out/benchmark.txt"
benchmark=${PIPESTATUS[0]}
[ "$benchmark" -eq 124 ] && say "the benchmark ran past its $benchmark_limit s and was stopped;" \
    "benchmark.json holds what it had measured"

# 8. a hang on nccl, under PyTorch's tools ------------------------------------------------------------
# the collective on rank 0 alone (pitfalls/step6_collective_on_rank_zero.py), on 2 GPUs: what DETAIL,
# monitored_barrier and the Flight Recorder's analyser say of it on nccl (docs/troubleshooting.md
# shows them on gloo)
if [ "$gpus" -ge 2 ]; then
    timeout -k 15 "$hangs_limit" "$python" benchmarks/hang_tools.py --backend nccl --keep "$out/hangs_nccl.json" \
        2>&1 | tee "$out/hangs_nccl.txt"
    hangs=${PIPESTATUS[0]}
    [ "$hangs" -eq 124 ] && say "the hang on nccl ran past its $hangs_limit s and was stopped"
else
    hangs=0
    say "the hang on nccl: skipped, it needs 2 GPUs (nccl puts each rank on a GPU of its own), $gpus here"
fi
# end of stage 8 --------------------------------------------------------------------------------------

# 9. FSDP2's memory ------------------------------------------------------------------------------------
if [ "$gpus" -ge 4 ]; then counts=2,4; elif [ "$gpus" -ge 2 ]; then counts=2; else counts=1; fi
timeout -k 15 "$memory_limit" "$python" benchmarks/memory.py --device cuda --nprocs "$counts" --repeats 1 \
    --keep "$out/memory.json" 2>&1 | tee "$out/memory.txt"
memory=${PIPESTATUS[0]}
[ "$memory" -eq 124 ] && say "the memory benchmark ran past its $memory_limit s and was stopped"
# end of 9 -------------------------------------------------------------------------------------------

say "tests exited $tests, traces $buckets, benchmark $benchmark, hang on nccl $hangs, memory $memory; outputs in $out"
[ "$tests" -eq 0 ] && [ "$buckets" -eq 0 ] && [ "$benchmark" -eq 0 ] && [ "$hangs" -eq 0 ] && [ "$memory" -eq 0 ]
