#!/usr/bin/env bash
# trace-jax as an xpk workload (github.com/AI-Hypercomputer/xpk) on a GKE cluster with TPU slices.
#
#   bash launch/xpk.sh create --cluster CLUSTER --image IMAGE [options] [-- key=value ...]   xpk workload create
#   bash launch/xpk.sh list   --cluster CLUSTER [--name NAME]                                 xpk workload list
#   bash launch/xpk.sh delete --cluster CLUSTER [--name NAME]                                 xpk workload delete
#
# Options:
#   --cluster CLUSTER      the xpk cluster (xpk cluster create made it)
#   --name NAME            workload name                       [default trace-jax]
#   --image IMAGE          container image with trace-jax on its PATH: `bash launch/gke.sh build --image IMAGE`
#   --tpu-type TYPE        e.g. v5litepod-8, v5p-16, v6e-64    [default v5litepod-8: one host; larger: several]
#   --num-slices N         slices of --tpu-type, joined over the data-center network  [default 1]
#   --max-restarts N       JobSet restarts after a failure     [default 0, xpk's; a restart reruns the same
#                          command, which continues from the newest checkpoint in checkpoint_dir (gs://...)]
#   --priority PRIORITY    very-low, low, medium, high or very-high  [default: xpk's, medium]
#   --project PROJECT      Google Cloud project                [default: gcloud's configured one]
#   --zone ZONE            the cluster's zone                  [default: gcloud's configured one]
#   --config FILE          a YAML config from configs/ (baked into the image)
#   --smoke                `trace-jax train --smoke`: a few steps at the config's shapes on random weights
#   --dry-run              print the xpk command instead of running it
#
# Several hosts (a type larger than one host: more than 8 chips, or TensorCores on v4/v5p) or several slices run
# `trace-jax train --multi-host` in every pod; they join through jax.distributed (xpk's TPU environment tells JAX
# the workers and slices) and need checkpoint_dir=gs://... (or out_dir=gs://...), which every pod writes.
set -euo pipefail
cd "$(dirname "$0")/.."

cluster=""
name=trace-jax
image=""
tpu_type=v5litepod-8
num_slices=1
max_restarts=""
priority=""
project=""
zone=""
config=""
smoke=0
dry=0

# shellcheck source=launch/common.sh
source launch/common.sh  # usage, die, run, train_checkpoint_dir

[ $# -ge 1 ] || { usage; exit 2; }
command=$1
shift
case $command in -h|--help) usage; exit 0 ;; esac
overrides=()
while [ $# -gt 0 ]; do
  case $1 in
    --cluster) cluster=${2:?--cluster needs a value}; shift 2 ;;
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --image) image=${2:?--image needs a value}; shift 2 ;;
    --tpu-type) tpu_type=${2:?--tpu-type needs a value}; shift 2 ;;
    --num-slices) num_slices=${2:?--num-slices needs a value}; shift 2 ;;
    --max-restarts) max_restarts=${2:?--max-restarts needs a value}; shift 2 ;;
    --priority) priority=${2:?--priority needs a value}; shift 2 ;;
    --project) project=${2:?--project needs a value}; shift 2 ;;
    --zone) zone=${2:?--zone needs a value}; shift 2 ;;
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --smoke) smoke=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; overrides=("$@"); break ;;
    *) die "unknown option '$1' (see: bash launch/xpk.sh --help)" ;;
  esac
done
case $command in create|list|delete) ;; *) die "unknown command '$command': use create, list or delete" ;; esac
[ -n "$cluster" ] || die "$command needs --cluster (the xpk cluster the workload runs on)"
[[ $name =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] || die "--name '$name' must start with a letter (a-z, 0-9, -)"
where=()
[ -n "$project" ] && where+=(--project "$project")
[ -n "$zone" ] && where+=(--zone "$zone")

create() {
  [ -n "$image" ] || die "create needs --image (built and pushed by: bash launch/gke.sh build --image IMAGE)"
  [[ $tpu_type =~ ^(v4|v5p|v5litepod|v6e)-([0-9]+)$ ]] ||
    die "unknown --tpu-type '$tpu_type': use v4-N, v5p-N, v5litepod-N or v6e-N"
  local size=${BASH_REMATCH[2]}
  [[ $num_slices =~ ^[1-9][0-9]*$ ]] || die "--num-slices must be a positive integer, got '$num_slices'"
  [[ -z $max_restarts || $max_restarts =~ ^[0-9]+$ ]] || die "--max-restarts takes a whole number"
  case $priority in ""|very-low|low|medium|high|very-high) ;;
    *) die "--priority '$priority' is not very-low, low, medium, high or very-high" ;; esac
  if [ -n "$config" ] && [ ! -f "$config" ]; then
    die "config file '$config' not found (it must be in this checkout, which the image holds)"
  fi
  local cmd=(trace-jax train)
  [ "$smoke" = 1 ] && cmd+=(--smoke)
  if [ "$size" -gt 8 ] || [ "$num_slices" -gt 1 ]; then
    local what="$tpu_type is a multi-host slice"
    [ "$num_slices" -gt 1 ] && what="$num_slices slices of $tpu_type are several hosts"
    [[ $(train_checkpoint_dir "$config" "${overrides[@]}") == gs://* ]] || die "$what: every pod writes its" \
      "shards of each checkpoint, so pass -- checkpoint_dir=gs://BUCKET/PATH (a path all pods reach)"
    cmd+=(--multi-host)
  fi
  [ -n "$config" ] && cmd+=(--config "$config")
  cmd+=("${overrides[@]}")
  local args=(--cluster "$cluster" --workload "$name" --docker-image "$image" --tpu-type "$tpu_type"
              --num-slices "$num_slices")
  [ -n "$max_restarts" ] && args+=(--max-restarts "$max_restarts")
  [ -n "$priority" ] && args+=(--priority "$priority")
  local quoted
  quoted=$(printf '%q ' "${cmd[@]}")
  run xpk workload create "${args[@]}" "${where[@]}" --command "${quoted% }"
}

case $command in
  create) create ;;
  list) run xpk workload list --cluster "$cluster" --filter-by-job "$name" "${where[@]}" ;;
  delete) run xpk workload delete --cluster "$cluster" --workload "$name" "${where[@]}" ;;
esac
