#!/usr/bin/env bash
# One idempotent set-up for Large-Batch Lab, used by both README commands and by CI.
#
#   scripts/setup.sh           runtime: Debian build tools, .venv, requirements, Horovod,
#                              the fused optimizer kernels
#   scripts/setup.sh --test    also the test dependencies (torch CPU, pytest, Chromium)
#
# Horovod 0.28.1 is built from source once, against the TensorFlow in .venv, with TensorFlow
# and Gloo (no MPI, no PyTorch, no MXNet). The wheel is cached in $LBL_CACHE (default
# ~/.cache/large-batch-lab) keyed by the TensorFlow version, so later runs and fresh clones
# reuse it. Set-up ends with `horovodrun --check-build`, which must show TensorFlow and Gloo.
# Python packages are installed at the exact versions in constraints.txt (scripts/lock.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LBL_VENV:-$ROOT/.venv}"
CACHE="${LBL_CACHE:-$HOME/.cache/large-batch-lab}"
PYTHON="${PYTHON:-python3.11}"
HOROVOD_VERSION=0.28.1
WITH_TESTS=0
[[ "${1:-}" == "--test" ]] && WITH_TESTS=1

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[setup] %s\033[0m\n' "$*" >&2; exit 1; }

# --- Debian packages -------------------------------------------------------------------------
# ssh and iproute2: multi-host runs, and the namespace cluster (python -m toolkit cluster).
apt_packages=(cmake g++ make git openssh-client openssh-server iproute2)
((WITH_TESTS)) && apt_packages+=(chromium)
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

stamp="$VENV/.lbl-requirements"
want="$(cat "$ROOT/requirements.txt" "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha1sum | cut -c1-12)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  say "installing requirements (first run: a few minutes)"
  pip_quiet --upgrade pip setuptools wheel
  pip_quiet -r "$ROOT/requirements.txt" -c "$ROOT/constraints.txt"
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
hstamp="$VENV/.lbl-horovod"
hwant="horovod $HOROVOD_VERSION, tensorflow $tf_version"
if [[ "$(version_of horovod)" != "$HOROVOD_VERSION" || "$(cat "$hstamp" 2>/dev/null)" != "$hwant" ]]; then
  if ! "$PY" -c 'import horovod.tensorflow' 2>/dev/null; then
    wheel_dir="$CACHE/horovod-$HOROVOD_VERSION-tf$tf_version-py311"
    if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
      say "building Horovod $HOROVOD_VERSION against TensorFlow $tf_version (about 3 minutes on 2 cores)"
      mkdir -p "$wheel_dir"
      # For GPUs, export HOROVOD_GPU_OPERATIONS=NCCL before running this script (see README).
      env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
          HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip wheel --disable-pip-version-check -q --no-build-isolation --no-deps \
          --no-binary horovod -w "$wheel_dir" "horovod==$HOROVOD_VERSION" \
        || { rm -rf "$wheel_dir"; die "Horovod build failed (see above). It needs cmake and g++ (apt-get install cmake g++)."; }
    fi
    say "installing Horovod from $wheel_dir"
    pip_quiet --no-deps "$wheel_dir"/horovod-*.whl
  fi
  "$VENV/bin/horovodrun" --check-build >"$VENV/.horovod-check-build" 2>&1 || true
  grep -qE '\[X\] TensorFlow' "$VENV/.horovod-check-build" && grep -qE '\[X\] Gloo' "$VENV/.horovod-check-build" \
    || { cat "$VENV/.horovod-check-build"; die "Horovod was built without TensorFlow or Gloo; delete $CACHE and re-run."; }
  echo "$hwant" >"$hstamp"
fi

# --- The toolkit's fused optimizer kernels ----------------------------------------------------
# toolkit/optimizers/fused_kernels.cc is a TensorFlow custom-op library (CPU kernels), compiled
# against the TensorFlow in the venv next to its source; rebuilt when either changes (seconds).
kernels_src="$ROOT/toolkit/optimizers/fused_kernels.cc"
kernels_lib="${kernels_src%.cc}.so"
kstamp="$VENV/.lbl-kernels"
kwant="$(sha1sum <"$kernels_src" | cut -c1-12), tensorflow $tf_version"
if [[ ! -f "$kernels_lib" || "$(cat "$kstamp" 2>/dev/null)" != "$kwant" ]]; then
  say "compiling the fused optimizer kernels (toolkit/optimizers/fused_kernels.cc)"
  read -r -a tf_flags < <(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c \
    'import tensorflow as tf; print(*tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags())')
  g++ -O3 -shared -fPIC "$kernels_src" -o "$kernels_lib.tmp" "${tf_flags[@]}" \
    || die "compiling $kernels_src failed (see above); it needs g++ (apt-get install g++)."
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
say "ready: TensorFlow $tf_version, Keras $(version_of keras), Horovod $(version_of horovod) (TensorFlow + Gloo)"
