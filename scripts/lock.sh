#!/usr/bin/env bash
# Rewrite the pins from .venv after `./lab test` passes: the exact versions of every package
# (Horovod aside, it is built from source), which scripts/setup.sh installs with.
#   CPU venv  constraints.txt, everything
#   GPU venv  constraints-gpu.txt, the CUDA build of TensorFlow and its nvidia-* wheels (the rest
#             is constraints.txt's, shared by both builds)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
frozen="$("$ROOT/.venv/bin/python" -m pip freeze --disable-pip-version-check --exclude-editable \
  | grep -v '^horovod' | sed 's/+cpu$//')"
if grep -q '^tensorflow==' <<<"$frozen"; then
  out="$ROOT/constraints-gpu.txt"
  {
    echo "# The CUDA build of TensorFlow's exact wheels, which scripts/setup.sh adds to constraints.txt on"
    echo "# GPU machines. Regenerate with scripts/lock.sh in a GPU venv."
    grep -E '^(tensorflow==|nvidia-)' <<<"$frozen"
  } >"$out"
else
  out="$ROOT/constraints.txt"
  {
    echo "# Exact versions the tests last passed with: pip constraints for scripts/setup.sh."
    echo "# Regenerate with scripts/lock.sh after changing a requirements file and passing ./lab test."
    echo "$frozen"
  } >"$out"
fi
echo "wrote $out ($(grep -vc '^#' "$out") packages)"
