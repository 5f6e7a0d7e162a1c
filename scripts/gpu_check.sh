#!/usr/bin/env bash
# The GPU check in one command, on a machine with an NVIDIA GPU (docs/guide/gpus-and-clusters.md, "GPUs"):
#
#   scripts/gpu_check.sh [OUT]       (default: gpu-check/)
#
#   1. set-up with the GPU build (scripts/setup.sh --test), timed
#   2. the machine: nvidia-smi, and Horovod's --check-build (NCCL must be there)
#   3. the GPU tests (tests/test_gpu.py): NCCL through a one-rank horovodrun, the optimizers and
#      XLA on GPU variables, the compressed allreduce, a mixed-precision run
#   4. bench_optimizers.py, plain and --jit (XLA): LARS and LBSGD against SGD on ResNet-50's
#      variables
#   5. bench_training.py --gpu: toolkit.train against model.fit, ResNet-50 at batch 256, mixed
#      precision, SGD and LARS
#   6. images/s of those two runs as toolkit.train logs them (python -m toolkit runs)
#   7. the whole test suite
#
# Each step writes OUT/<n>-<step>.log and its time to OUT/summary.md; a failing step is marked
# there and the next ones still run. The exit status is the number of failed steps.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="$(realpath -m "${1:-gpu-check}")"
mkdir -p "$OUT"
PY="$ROOT/.venv/bin/python"
export LBL_GPU=1 LBL_RUNS="$OUT/runs"
echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)" >"$OUT/summary.md"

CHECK=gpu-check
source "$ROOT/scripts/check_steps.sh"

step 1-setup scripts/setup.sh --test
step 2-machine bash -c 'nvidia-smi && cat .venv/.horovod-check-build && grep -q "\[X\] NCCL" .venv/.horovod-check-build'
step 3-gpu-tests "$PY" -m pytest tests/test_gpu.py -v -rs
step 4-bench-optimizers bash -c "'$PY' experiments/bench_optimizers.py --repeats 30 && '$PY' experiments/bench_optimizers.py --repeats 30 --jit"
step 5-bench-training "$PY" experiments/bench_training.py --gpu --repeat 3
for optimizer in sgd lars; do
  step "6-resnet50-$optimizer" "$PY" -m toolkit.train experiments/resnet50_synthetic.yaml \
    --set workers=1 --set batch.per_worker=256 --set precision=mixed_float16 --set epochs=2 \
    --set steps_per_epoch=20 --set dataset.params.num_samples=6400 --set logging.every_steps=5 \
    --set optimizer.name=$optimizer --run-dir "$LBL_RUNS/resnet50-$optimizer"
done
step 6-images-per-second "$PY" -m toolkit runs
step 7-test-suite "$PY" -m pytest -q
echo "[gpu-check] $failed failed; summary in $OUT/summary.md"
exit "$failed"
