#!/usr/bin/env bash
# One idempotent set-up for Large-Batch Lab, used by both README commands and by CI.
#
#   scripts/setup.sh           runtime: Debian build tools, .venv, requirements, Horovod,
#                              the fused optimizer kernels
#   scripts/setup.sh --test    also the test dependencies (pytest, Chromium, Slurm)
#   scripts/setup.sh --detect  only say which build this machine gets, CPU or GPU, and why
#
# The GPU build is chosen where `nvidia-smi -L` lists a GPU (the rule the launch queue counts
# its slots by, toolkit/launching/slots.py); LBL_GPU=1 forces it (it builds without a GPU: nvcc needs
# none) and LBL_GPU=0 forces the CPU build. The two differ in two things:
#   CPU  tensorflow-cpu; Horovod with TensorFlow, PyTorch and Gloo
#   GPU  tensorflow[and-cuda] (CUDA 12 and cuDNN as PyPI wheels); Horovod also with NCCL,
#        compiled by CUDA 13's nvcc from PyPI wheels (PyPI ships no CUDA 12 nvcc), so no
#        system CUDA toolkit is needed; HOROVOD_CUDA_HOME=/usr/local/cuda-12.x uses one.
# Horovod 0.28.1 is built from source once, against the TensorFlow and PyTorch in .venv (no
# MPI, no MXNet). The wheel is cached in $LBL_CACHE (default ~/.cache/large-batch-lab)
# under a name that gives the TensorFlow and PyTorch versions and, for GPUs, "gpu", so later
# runs and fresh clones reuse it and CPU and GPU wheels never mix. Set-up ends with
# `horovodrun --check-build`, which must show TensorFlow, PyTorch and Gloo (and NCCL on the GPU
# build).
# Python packages are installed at the exact versions in constraints.txt, plus
# constraints-gpu.txt on the GPU build (scripts/lock.sh writes both).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LBL_VENV:-$ROOT/.venv}"
CACHE="${LBL_CACHE:-$HOME/.cache/large-batch-lab}"
PYTHON="${PYTHON:-python3.11}"
HOROVOD_VERSION=0.28.1
WITH_TESTS=0
case "${1:-}" in
  --test) WITH_TESTS=1 ;;
  --detect | "") ;;
  *) echo "usage: scripts/setup.sh [--test | --detect]" >&2; exit 2 ;;
esac

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[setup] %s\033[0m\n' "$*" >&2; exit 1; }

# --- CPU or GPU --------------------------------------------------------------------------------
case "${LBL_GPU:-}" in
  1) FLAVOUR=gpu; why="LBL_GPU=1" ;;
  0) FLAVOUR=cpu; why="LBL_GPU=0" ;;
  "")
    gpus=0
    if command -v nvidia-smi >/dev/null; then
      gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
      why="nvidia-smi lists $gpus GPUs"
    else
      why="no nvidia-smi on PATH"
    fi
    if ((gpus > 0)); then FLAVOUR=gpu; else FLAVOUR=cpu; fi ;;
  *) die "LBL_GPU must be 1 (the GPU build) or 0 (the CPU build), or unset to detect; got '$LBL_GPU'." ;;
esac
if [[ "${1:-}" == "--detect" ]]; then
  echo "$FLAVOUR ($why)"
  exit 0
fi
say "$FLAVOUR build ($why)"

# --- Debian packages -------------------------------------------------------------------------
# ssh and iproute2: multi-host runs, and the namespace cluster (python -m toolkit cluster);
# for the tests also Chromium and Slurm with MUNGE (the cluster's Slurm: cluster up --slurm).
apt_packages=(cmake g++ make git openssh-client openssh-server iproute2)
((WITH_TESTS)) && apt_packages+=(chromium slurmctld slurmd slurm-client munge)
[[ $FLAVOUR == gpu ]] && apt_packages+=(patchelf)  # Horovod's path to NCCL, below
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    say "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  elif command -v apt-get >/dev/null && command -v sudo >/dev/null; then
    say "installing Debian packages with sudo: ${missing[*]}"
    sudo apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    die "missing system packages: ${missing[*]}. Install them (Debian: apt-get install ${missing[*]}) and re-run."
  fi
fi

# --- Python virtual environment --------------------------------------------------------------
command -v "$PYTHON" >/dev/null || die "$PYTHON not found. Install Python 3.11 (Debian: apt-get install python3.11 python3.11-venv) or set PYTHON=/path/to/python3.11."
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "$PYTHON is $("$PYTHON" --version 2>&1); Large-Batch Lab needs Python 3.11 (TensorFlow 2.18 + Horovod 0.28.1)."
if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV" || die "could not create a venv (Debian: apt-get install python3.11-venv)."
fi
PY="$VENV/bin/python"
pip_quiet() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

# The flavour's TensorFlow (requirements-cpu.txt or requirements-gpu.txt) and its pins. The two
# TensorFlow distributions write the same files, so a venv changing flavour drops the other first.
requirements=(-r "$ROOT/requirements.txt" -r "$ROOT/requirements-$FLAVOUR.txt" -c "$ROOT/constraints.txt")
[[ $FLAVOUR == gpu ]] && requirements+=(-c "$ROOT/constraints-gpu.txt")
other_tensorflow=tensorflow
[[ $FLAVOUR == gpu ]] && other_tensorflow=tensorflow-cpu
stamp="$VENV/.lbl-requirements"
want="$FLAVOUR $(cat "$ROOT"/requirements*.txt "$ROOT/pyproject.toml" "$ROOT"/constraints*.txt | sha1sum | cut -c1-12)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  say "installing requirements (first run: a few minutes$([[ $FLAVOUR == gpu ]] && echo ', about 3 GB of CUDA wheels'))"
  pip_quiet --upgrade pip setuptools wheel
  "$PY" -m pip uninstall --disable-pip-version-check -q -y "$other_tensorflow" 2>/dev/null || true
  pip_quiet "${requirements[@]}"
  pip_quiet --no-deps -e "$ROOT"
  echo "$want" >"$stamp"
fi

# --- Horovod, built from source once ---------------------------------------------------------
# Checked without importing TensorFlow (seconds each time): package metadata, and a stamp that
# records the Horovod and TensorFlow versions `horovodrun --check-build` last passed with.
version_of() {  # the installed version of the first of the given distributions, or nothing
  "$PY" - "$@" <<'PYEOF'
import importlib.metadata as metadata, sys
for name in sys.argv[1:]:
    try:
        print(metadata.version(name))
        break
    except metadata.PackageNotFoundError:
        pass
PYEOF
}
tf_version="$(version_of tensorflow-cpu tensorflow)"
torch_version="$(version_of torch)"
build_env=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1
  HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)")
built_with=(TensorFlow PyTorch Gloo)
wheel_dir="$CACHE/horovod-$HOROVOD_VERSION-tf$tf_version-torch${torch_version%%+*}-py311"
if [[ $FLAVOUR == gpu ]]; then
  built_with+=(NCCL)
  wheel_dir+="-gpu"
fi
hstamp="$VENV/.lbl-horovod"
hwant="horovod $HOROVOD_VERSION, tensorflow $tf_version, torch $torch_version, ${built_with[*]}"

cuda_build_home() {  # a CUDA toolkit with nvcc for Horovod's build: HOROVOD_CUDA_HOME, or PyPI's
  if [[ -n "${HOROVOD_CUDA_HOME:-}" ]]; then
    echo "$HOROVOD_CUDA_HOME"
    return
  fi
  local dir home
  dir="$CACHE/cuda-build-$(sha1sum <"$ROOT/requirements-cuda-build.txt" | cut -c1-8)"
  home="$dir/nvidia/cu13"
  if [[ ! -x "$home/bin/nvcc" ]]; then
    say "installing CUDA 13's nvcc from PyPI into $dir (for Horovod's build only)" >&2
    pip_quiet --no-deps --target "$dir" -r "$ROOT/requirements-cuda-build.txt" >&2
  fi
  # Names the wheels lack: nvcc.profile looks in lib64, CMake's FindCUDAToolkit for libcudart.so.
  ln -sfn lib "$home/lib64"
  ln -sfn libcudart.so.13 "$home/lib/libcudart.so"
  echo "$home"
}

horovod_source() {  # Horovod's sdist, unpacked into a temporary directory and patched: its path
  # Horovod 0.28.1 compiles with C++14, and PyTorch 2's headers need C++17 ("You need C++17 to
  # compile PyTorch": horovod/horovod#3996, #4014). The fix (#3998: C++17 for the PyTorch
  # plugin) was merged after the last release, so the same change is made here, to the whole
  # build as well: the plugin links Gloo's static library, and Gloo compiled as C++14 defines a
  # constexpr member that C++17 code defines again (a "multiple definition" at link time).
  local dir
  dir="$(mktemp -d)"
  "$PY" -m pip download --disable-pip-version-check -q --no-deps --no-binary horovod \
    -d "$dir" "horovod==$HOROVOD_VERSION" >&2
  tar -xzf "$dir"/horovod-*.tar.gz -C "$dir"
  sed -i 's/^set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$dir/horovod-$HOROVOD_VERSION/CMakeLists.txt"
  sed -i 's/^    set(CMAKE_CXX_STANDARD 14)/    set(CMAKE_CXX_STANDARD 17)/' \
    "$dir/horovod-$HOROVOD_VERSION/horovod/torch/CMakeLists.txt"
  [[ $(grep -c 'CMAKE_CXX_STANDARD 17)' "$dir/horovod-$HOROVOD_VERSION/CMakeLists.txt" \
    "$dir/horovod-$HOROVOD_VERSION/horovod/torch/CMakeLists.txt" | grep -c ':[1-9]') == 2 ]] \
    || die "Horovod's sdist changed: its C++ standard is not where setup.sh patches it"
  echo "$dir/horovod-$HOROVOD_VERSION"
}

if [[ "$(version_of horovod)" != "$HOROVOD_VERSION" || "$(cat "$hstamp" 2>/dev/null)" != "$hwant" ]]; then
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    if [[ $FLAVOUR == gpu ]]; then
      # NCCL is TensorFlow's own wheel (nvidia-nccl-cu12), linked as a shared library; CMake
      # looks for the unversioned name the wheel lacks.
      nccl="$("$PY" -c 'import nvidia.nccl; print(nvidia.nccl.__path__[0])')"
      ln -sfn libnccl.so.2 "$nccl/lib/libnccl.so"
      build_env+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$(cuda_build_home)"
        HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$nccl/lib" HOROVOD_NCCL_LINK=SHARED)
    fi
    say "building Horovod $HOROVOD_VERSION with ${built_with[*]} against TensorFlow $tf_version and PyTorch $torch_version (about 4 minutes on 2 cores)"
    mkdir -p "$wheel_dir"
    source_dir="$(horovod_source)"
    env "${build_env[@]}" "$PY" -m pip wheel --disable-pip-version-check -q --no-cache-dir \
        --no-build-isolation --no-deps -w "$wheel_dir" "$source_dir" \
      || { rm -rf "$wheel_dir"; die "Horovod build failed (see above). It needs cmake and g++ (apt-get install cmake g++)."; }
    rm -rf "$(dirname "$source_dir")"
  fi
  say "installing Horovod from $wheel_dir"
  pip_quiet --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
  if [[ $FLAVOUR == gpu ]]; then
    # The build recorded the absolute NCCL directory of the venv that built the wheel; look in
    # this venv's instead, relative to the library, so the cached wheel serves any venv.
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
    for lib in "$site"/horovod/*/mpi_lib*.so; do
      if patchelf --print-needed "$lib" | grep -q '^libnccl'; then
        patchelf --set-rpath "\$ORIGIN/$(realpath --relative-to="$(dirname "$lib")" "$site")/nvidia/nccl/lib" "$lib"
      fi
    done
  fi
  "$VENV/bin/horovodrun" --check-build >"$VENV/.horovod-check-build" 2>&1 || true
  for framework in "${built_with[@]}"; do
    grep -qE "\[X\] $framework" "$VENV/.horovod-check-build" \
      || { cat "$VENV/.horovod-check-build"; die "Horovod was built without $framework; delete $wheel_dir and re-run."; }
  done
  echo "$hwant" >"$hstamp"
fi

# --- The toolkit's fused kernels ---------------------------------------------------------------
# One TensorFlow custom-op library (CPU kernels) from two sources: the optimizers' momentum steps
# and trust ratio (toolkit/optimizers/fused_kernels.cc) and the compressed allreduce's codecs
# (toolkit/parallel/codec_kernels.cc), compiled against the TensorFlow in the venv into
# toolkit/optimizers/fused_kernels.so; rebuilt when a source or TensorFlow changes (seconds).
# No -march and no FP contraction: the kernels must do the float operations the unfused
# TensorFlow ops do, bit for bit.
kernels_srcs=("$ROOT/toolkit/optimizers/fused_kernels.cc" "$ROOT/toolkit/parallel/codec_kernels.cc")
kernels_lib="$ROOT/toolkit/optimizers/fused_kernels.so"
kstamp="$VENV/.lbl-kernels"
kwant="$(cat "${kernels_srcs[@]}" | sha1sum | cut -c1-12), tensorflow $tf_version"
if [[ ! -f "$kernels_lib" || "$(cat "$kstamp" 2>/dev/null)" != "$kwant" ]]; then
  say "compiling the fused kernels (${kernels_srcs[*]#"$ROOT/"})"
  read -r -a tf_flags < <(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c \
    'import tensorflow as tf; print(*tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags())')
  g++ -O3 -ffp-contract=off -shared -fPIC "${kernels_srcs[@]}" -o "$kernels_lib.tmp" "${tf_flags[@]}" \
    || die "compiling the fused kernels failed (see above); it needs g++ (apt-get install g++)."
  mv "$kernels_lib.tmp" "$kernels_lib"
  echo "$kwant" >"$kstamp"
fi

# --- Test dependencies -----------------------------------------------------------------------
if ((WITH_TESTS)); then
  tstamp="$VENV/.lbl-test-requirements"
  twant="$(cat "$ROOT/requirements-test.txt" "$ROOT/constraints.txt" | sha1sum | cut -c1-12)"
  if [[ "$(cat "$tstamp" 2>/dev/null)" != "$twant" ]]; then
    say "installing test requirements"
    pip_quiet -r "$ROOT/requirements-test.txt" -c "$ROOT/constraints.txt"
    echo "$twant" >"$tstamp"
  fi
fi
say "ready: TensorFlow $tf_version ($FLAVOUR), Keras $(version_of keras), Horovod $(version_of horovod) (${built_with[*]})"
