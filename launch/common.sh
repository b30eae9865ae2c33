# Shared by the cloud launch scripts (sourced after they cd to the repository root).
# shellcheck shell=bash

# The script's header comment, as its help.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

die() { echo "$(basename "$0"): error: $*" >&2; exit 2; }

# Runs a command, or prints it shell-quoted when the script's `dry` is 1 (--dry-run).
run() {
  if [ "${dry:-0}" = 1 ]; then
    printf '%q ' "$@" | sed 's/ $//'
    echo
  else
    "$@"
  fi
}
