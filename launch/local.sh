#!/usr/bin/env bash
# One command on a fresh machine: set up what is missing, then run.
#   bash launch/local.sh train [key=value ...]    the main job (a CPU-sized TRACE run on HopWorld)
#   bash launch/local.sh test [pytest args ...]   the default test suite (-m slow for the slow tier)
#   bash launch/local.sh <any trace-jax command>  e.g. compare, sft, bench sampler
# Setup: a .venv beside the repo with the package and launch/no_deps.txt (for `test`, also the test extra: pytest,
# PyTorch CPU for the parity tests, mkdocs), reinstalled whenever pyproject.toml or no_deps.txt changes.
set -euo pipefail
cd "$(dirname "$0")/.."
target=. stamp=.venv/.trace-jax-installed
if [ "${1:-}" = test ]; then target='.[test]' stamp=$stamp-test; fi
want=$(cat pyproject.toml launch/no_deps.txt | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing trace-jax ($target) into .venv (first run only)" >&2
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e "$target"
  .venv/bin/python -m pip install -q --no-deps -r launch/no_deps.txt  # bfcl-eval, without its pinned dependencies
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
