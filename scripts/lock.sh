#!/usr/bin/env bash
# Rewrite constraints.txt from .venv after `./lab test` passes: the exact versions of every
# package (Horovod aside, it is built from source), which scripts/setup.sh installs with.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
{
  echo "# Exact versions the tests last passed with: pip constraints for scripts/setup.sh."
  echo "# Regenerate with scripts/lock.sh after changing a requirements file and passing ./lab test."
  "$ROOT/.venv/bin/python" -m pip freeze --disable-pip-version-check --exclude-editable \
    | grep -v '^horovod' | sed 's/+cpu$//'
} >"$ROOT/constraints.txt"
echo "wrote $ROOT/constraints.txt ($(grep -vc '^#' "$ROOT/constraints.txt") packages)"
