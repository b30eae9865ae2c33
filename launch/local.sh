#!/usr/bin/env bash
# One command on a fresh machine: set up what is missing, then run.
#   bash launch/local.sh train [key=value ...]    the main job (a CPU-sized TRACE run on HopWorld)
#   bash launch/local.sh test [pytest args ...]   the default test suite (-m slow for the slow tier)
#   bash launch/local.sh <any trace-jax command>  e.g. compare, sft, bench sampler
# Setup: a .venv beside the repo with the package and bfcl-eval (for `test`, also the test extra: pytest, PyTorch
# CPU for the parity tests, mkdocs), reinstalled whenever pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."
target=. stamp=.venv/.trace-jax-installed
if [ "${1:-}" = test ]; then target='.[test]' stamp=$stamp-test; fi
# BFCL's data, simulated APIs and checkers (trace_jax/envs/bfcl), installed without its declared dependencies (they
# pin numpy==1.26.4 and pull API clients): what its multi-turn code imports is in pyproject.toml
bfcl='bfcl-eval==2026.3.23'
want=$( (cat pyproject.toml; echo "$bfcl") | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing trace-jax ($target) into .venv (first run only)" >&2
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e "$target"
  .venv/bin/python -m pip install -q --no-deps "$bfcl"
  echo "$want" > "$stamp"
fi
if [ $# -eq 0 ]; then
  sed -n '2,5p' "$0" | sed 's/^# //'
  exit 2
fi
if [ "$1" = test ]; then
  shift
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/trace-jax "$@"
