#!/usr/bin/env bash
# The GPU check through Keras's JAX and PyTorch backends, for a machine that has Python, JAX and
# PyTorch (on CUDA) but no TensorFlow or Horovod, and no package registry: the GPU machines this
# project is lent (docs/guide/gpus-and-clusters.md, "GPUs through Keras on JAX and PyTorch").
#
#   scripts/gpu_check_keras.sh wheels [DIR]     here: download into DIR (default .whl) the wheels
#                                               the other machine lacks, for its Python 3.12
#   scripts/gpu_check_keras.sh [--smoke] [OUT]  there: the check (default OUT: gpu-check-keras/)
#
# Wheels in $LBL_WHEELS (default .whl), if any, are installed first into a folder of their own on
# PYTHONPATH, without their dependencies and without touching the machine's packages. Then:
#   1. the machine: Python, the GPUs, JAX's and PyTorch's devices
#   2. bench_optimizers.py on JAX and on PyTorch: one update of ResNet-50's variables with our
#      SGD, LARS and LBSGD against Keras's SGD (on PyTorch, our multi-tensor update and the
#      per-variable one it replaced)
#   3. bench_resnet50.py on JAX and on PyTorch: images/s of ResNet-50 trained with our LARS
#      against Keras's SGD
#   4. the optimizer, schedule and AdaScale oracle tests on each backend, on its default (GPU)
#      device, and on PyTorch the multi-tensor update against the per-variable one
# --smoke runs the benchmarks at a toy size (tiny models in place of ResNet-50) and leaves out
# the tests, which CI runs on every backend anyway: CI runs the smoke on the CPU, so that the
# check works on first contact with a GPU. Each step writes OUT/<step>.log and a line to
# OUT/summary.md; the benchmarks' CSVs go to OUT. The exit status is the number of failed
# steps.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
# What the GPU machines lack: Keras and its dependencies but numpy, ml_dtypes, h5py, rich,
# absl-py and packaging, and pydantic for the tests that read the config's schedule names.
# Versions: constraints.txt's, which the tests here pass with.
WHEELS=(keras namex optree pydantic pydantic_core annotated-types typing-inspection)
ORACLE_TESTS=(tests/test_sgd_vs_torch.py tests/test_lars.py tests/test_lbsgd.py tests/test_schedules.py
  tests/test_adascale_gain.py)

if [[ "${1:-}" == wheels ]]; then
  dir="${2:-.whl}"
  pins=()
  for name in "${WHEELS[@]}"; do pins+=("$(grep -i "^$name==" constraints.txt)"); done
  exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dir" "${pins[@]}"
fi

SMOKE=0
[[ "${1:-}" == --smoke ]] && { SMOKE=1; shift; }
OUT="$(realpath -m "${1:-gpu-check-keras}")"
mkdir -p "$OUT"
export BENCH_CSV_DIR="$OUT" PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
wheels="${LBL_WHEELS:-.whl}"
if compgen -G "$wheels/*.whl" >/dev/null; then
  site="$(mktemp -d)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ((SMOKE)); then
  updates=(--repeats 2 --model tiny)
  resnet=(--batch 2 --steps 1 --repeats 1 --image-size 32 --precision float32 --model tiny)
else
  updates=(--repeats 30) resnet=(--batch 256 --steps 20 --repeats 3)
fi
echo "# Keras GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null)" >"$OUT/summary.md"

CHECK=gpu-check-keras
source "$ROOT/scripts/check_steps.sh"

step 1-machine env KERAS_BACKEND=jax bash -c "'$PY' --version; nvidia-smi -L || true;
  '$PY' -c 'import jax, torch, keras; print(\"jax\", jax.__version__, jax.devices());
print(\"torch\", torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name());
print(\"keras\", keras.__version__)'"
for backend in jax torch; do
  step "2-bench-optimizers-$backend" env KERAS_BACKEND=$backend \
    "$PY" experiments/bench_optimizers.py "${updates[@]}"
done
for backend in jax torch; do
  step "3-bench-resnet50-$backend" env KERAS_BACKEND=$backend \
    "$PY" experiments/bench_resnet50.py "${resnet[@]}"
done
if ((!SMOKE)); then  # CI runs these on every backend already (tests/test_every_backend.py)
  for backend in jax torch; do
    only=()
    [[ $backend == torch ]] && only=(tests/on_torch)
    step "4-oracle-tests-$backend" env KERAS_BACKEND=$backend "$PY" -m pytest -q \
      -p no:cacheprovider "${ORACLE_TESTS[@]}" "${only[@]}"
  done
fi
for log in "$OUT"/2-*.log "$OUT"/3-*.log; do grep '^|' "$log" >>"$OUT/summary.md" && echo >>"$OUT/summary.md"; done
echo "[gpu-check-keras] $failed failed; summary in $OUT/summary.md"
exit "$failed"
