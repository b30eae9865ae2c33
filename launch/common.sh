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

# Where `trace-jax train --config CONFIG KEY=VALUE ...` writes its checkpoints: checkpoint_dir, else
# out_dir/checkpoints (trace-jax's defaults), the later setting winning as in trace-jax. CONFIG may be "";
# only its top-level `out_dir:` and `checkpoint_dir:` lines are read.
train_checkpoint_dir() {
  local config=$1 out=runs/hopworld_trace checkpoint="" line value
  shift
  if [ -n "$config" ] && [ -f "$config" ]; then
    while IFS= read -r line; do
      [[ $line =~ ^(out_dir|checkpoint_dir):[[:space:]]*([^#[:space:]]*) ]] || continue
      value=${BASH_REMATCH[2]//[\"\']/}
      if [ "${BASH_REMATCH[1]}" = out_dir ]; then out=$value; else checkpoint=$value; fi
    done < "$config"
  fi
  for line in "$@"; do
    value=${line#*=}
    value=${value//[\"\']/}
    case $line in
      out_dir=*) out=$value ;;
      checkpoint_dir=*) checkpoint=$value ;;
    esac
  done
  echo "${checkpoint:-${out%/}/checkpoints}"
}
