#!/usr/bin/env bash
# trace-jax on a Cloud TPU VM: create it, install this checkout on every worker, train, stream logs, delete.
#
#   bash launch/tpu_pod.sh up      [options] [-- key=value ...]   create + install + train + logs
#   bash launch/tpu_pod.sh create  [options]                      the TPU VM (or a queued resource with --queued)
#   bash launch/tpu_pod.sh install [options]                      this checkout (git-tracked files) on every worker
#   bash launch/tpu_pod.sh train   [options] [-- key=value ...]   `trace-jax train` on --worker=all, in the background
#   bash launch/tpu_pod.sh logs    [options]                      stream worker 0's training log
#   bash launch/tpu_pod.sh delete  [options]                      delete the TPU VM (and its queued resource)
#
# Options (each also read from the environment variable in brackets):
#   --name NAME        TPU VM name                        [TPU_NAME, default trace-jax]
#   --zone ZONE        zone                               [TPU_ZONE, default us-east5-b]
#   --type TYPE        accelerator type                   [TPU_TYPE, default v5litepod-8: one host; larger: several]
#   --version VERSION  TPU software version               [TPU_VERSION, default: the type's base image]
#   --project PROJECT  Google Cloud project               [TPU_PROJECT, default: gcloud's configured one]
#   --spot             spot capacity (preemptible; needs gs:// checkpoints); --reserved: a reservation
#   --queued           create through a queued resource (waits for capacity)
#   --slices N         N slices of --type joined over the data-center network (multislice; needs --queued):
#                      nodes NAME-0 .. NAME-(N-1), every worker of every slice trains  [TPU_SLICES, default 1]
#   --config FILE      YAML config for `trace-jax train`  [TPU_CONFIG]
#   --run-dir DIR      the run's out_dir: metrics, TensorBoard, evaluations, the final policy  [TPU_RUN_DIR,
#                      default NAME, i.e. ~/trace-jax-runs/NAME on the VM; or gs://BUCKET/PATH]
#   --checkpoint-dir D orbax checkpoints, e.g. gs://BUCKET/run  [TPU_CHECKPOINT_DIR, default RUN_DIR/checkpoints;
#                      a multi-host type or --spot needs a gs:// path (or a gs:// --run-dir)]
#   --staged gs://B/P  train: first copy what launch/stage.sh put in gs://B/P/staged to ~/trace-jax-runs/staged
#                      on every worker (the base policy and QA files trace-jax reads from local disk)  [TPU_STAGED]
#   --smoke            train: `trace-jax train --smoke`, a few steps at the config's shapes on random weights
#   --resume           train: require a checkpoint to continue from (the same command continues one without it)
#   --dry-run          print the gcloud commands instead of running them
#
# On the VM, ~/trace-jax holds the code (`install` replaces it) and ~/trace-jax-runs everything else: it is
# train's working directory (relative paths in the config resolve there), with the run directory, logs/NAME.log
# and staged/. A multi-host type (e.g. v5litepod-16, v4-16), or several slices, runs `trace-jax train
# --multi-host` on every worker: they join through jax.distributed (found automatically on a TPU VM) and train
# as one run, the mesh's data axis spanning the slices. See launch/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

name=${TPU_NAME:-trace-jax}
zone=${TPU_ZONE:-us-east5-b}
type=${TPU_TYPE:-v5litepod-8}
version=${TPU_VERSION:-}
project=${TPU_PROJECT:-}
config=${TPU_CONFIG:-}
run_dir=${TPU_RUN_DIR:-}
checkpoint_dir=${TPU_CHECKPOINT_DIR:-}
staged=${TPU_STAGED:-}
slices=${TPU_SLICES:-1}
capacity=""
queued=0
resume=0
smoke=0
dry=0
remote_dir=trace-jax     # the code, replaced by install
work_dir=trace-jax-runs  # train's working directory: runs, logs, staged inputs, data built on first use

# shellcheck source=launch/common.sh
source launch/common.sh  # usage, die, run, train_checkpoint_dir

[ $# -ge 1 ] || { usage; exit 2; }
command=$1
shift
case $command in -h|--help) usage; exit 0 ;; esac
overrides=()
while [ $# -gt 0 ]; do
  case $1 in
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --zone) zone=${2:?--zone needs a value}; shift 2 ;;
    --type) type=${2:?--type needs a value}; shift 2 ;;
    --version) version=${2:?--version needs a value}; shift 2 ;;
    --project) project=${2:?--project needs a value}; shift 2 ;;
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --run-dir) run_dir=${2:?--run-dir needs a value}; shift 2 ;;
    --checkpoint-dir) checkpoint_dir=${2:?--checkpoint-dir needs a value}; shift 2 ;;
    --staged) staged=${2:?--staged needs a value}; shift 2 ;;
    --spot) capacity=--spot; shift ;;
    --reserved) capacity=--reserved; shift ;;
    --queued) queued=1; shift ;;
    --slices) slices=${2:?--slices needs a value}; shift 2 ;;
    --smoke) smoke=1; shift ;;
    --resume) resume=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; overrides=("$@"); break ;;
    *) die "unknown option '$1' (see: bash launch/tpu_pod.sh --help)" ;;
  esac
done
run_dir=${run_dir:-$name}

# One host holds up to 8 of the unit the type counts (v4/v5p: TensorCores, v5e/v6e: chips): v4-8, v5p-8,
# v5litepod-8 and v6e-8 are the largest single-host slices.
case $type in
  v4-*) default_version=tpu-ubuntu2204-base ;;
  v5p-*) default_version=v2-alpha-tpuv5 ;;
  v5litepod-*) default_version=v2-alpha-tpuv5-lite ;;
  v6e-*) default_version=v2-alpha-tpuv6e ;;
  *) die "unknown accelerator type '$type': use v4-N, v5p-N, v5litepod-N or v6e-N" ;;
esac
version=${version:-$default_version}
size=${type##*-}
[[ $size =~ ^[0-9]+$ ]] || die "accelerator type '$type' does not end in a size"
[[ $slices =~ ^[1-9][0-9]*$ ]] || die "--slices must be a positive integer, got '$slices'"
[ "$slices" = 1 ] || [ "$queued" = 1 ] || die "--slices $slices creates a multislice queued resource: add --queued"
if [ -n "$config" ] && [ ! -f "$config" ]; then
  die "config file '$config' not found"
fi

# What train passes after the config: its out_dir, checkpoint_dir, then the user's overrides (the last one wins).
train_args=("out_dir=$run_dir")
[ -n "$checkpoint_dir" ] && train_args+=("checkpoint_dir=$checkpoint_dir")
train_args+=("${overrides[@]}")
checkpoints=$(train_checkpoint_dir "$config" "${train_args[@]}")

local_dir_ok() {  # a path on the workers: outside the code directory, which install replaces
  local option=$1 dir=$2
  [[ -z $dir || $dir == gs://* ]] && return 0
  [[ $dir == "~"* ]] && die "$option '$dir': '~' is not expanded on the workers; give an absolute path or one" \
    "relative to ~/$work_dir (train's working directory)"
  if [[ $dir =~ ^(/home/[^/]+/|/root/|(\./)*\.\./)$remote_dir(/|$) ]]; then
    die "$option '$dir' is inside ~/$remote_dir, the code directory that install replaces: give a path outside" \
      "it, relative to ~/$work_dir (train's working directory; e.g. $option $name) or gs://BUCKET/PATH"
  fi
}

multi_host=0
if [ "$size" -gt 8 ] || [ "$slices" -gt 1 ]; then
  multi_host=1
  what="$type is a multi-host slice"
  [ "$slices" -gt 1 ] && what="$slices slices of $type are several hosts"
  if [ "$command" = up ] || [ "$command" = train ]; then
    [[ $checkpoints == gs://* ]] || die "$what: every worker writes its shards of each" \
      "checkpoint, so pass --checkpoint-dir gs://BUCKET/PATH (a path all workers reach)"
  fi
fi
if [ "$capacity" = --spot ] && { [ "$command" = up ] || [ "$command" = train ] || [ "$command" = create ]; }; then
  [[ $checkpoints == gs://* ]] || die "--spot: a preempted spot VM comes back without its disk, so the run" \
    "continues only from checkpoints outside it: pass --checkpoint-dir gs://BUCKET/PATH (or --run-dir gs://...)"
fi
if [ "$command" = up ] || [ "$command" = train ]; then
  local_dir_ok --run-dir "$run_dir"
  local_dir_ok --checkpoint-dir "$checkpoint_dir"
  [[ -z $staged || $staged == gs://* ]] || die "--staged '$staged': give the gs:// path that launch/stage.sh" \
    "--bucket staged to"
fi
nodes=("$name")  # the TPU VMs: one, or NAME-0 .. NAME-(N-1) of a multislice queued resource
if [ "$slices" -gt 1 ]; then
  nodes=()
  for ((i = 0; i < slices; i++)); do nodes+=("$name-$i"); done
fi

where=(--zone "$zone")
[ -n "$project" ] && where+=(--project "$project")

create() {
  if [ "$queued" = 1 ]; then
    local args=(--node-id "$name" --accelerator-type "$type" --runtime-version "$version")
    [ "$slices" -gt 1 ] && args=(--node-count "$slices" --node-prefix "$name" --accelerator-type "$type"
                                 --runtime-version "$version")
    [ -n "$capacity" ] && args+=("$capacity")
    run gcloud compute tpus queued-resources create "$name" "${where[@]}" "${args[@]}"
    echo "tpu_pod.sh: queued; 'gcloud compute tpus queued-resources describe $name --zone $zone' shows its state" >&2
  else
    local args=(--accelerator-type "$type" --version "$version")
    [ "$capacity" = --spot ] && args+=(--spot)
    [ "$capacity" = --reserved ] && args+=(--reserved)
    run gcloud compute tpus tpu-vm create "$name" "${where[@]}" "${args[@]}"
  fi
}

wait_active() {  # a queued resource: until its slices are provisioned (ACTIVE), before anything is copied to them
  [ "$queued" = 1 ] || return 0
  local describe=(gcloud compute tpus queued-resources describe "$name" "${where[@]}" --format 'value(state.state)')
  if [ "$dry" = 1 ]; then
    run "${describe[@]}"
    return 0
  fi
  local state
  while state=$("${describe[@]}") && [ "$state" != ACTIVE ]; do
    case $state in FAILED|SUSPENDED) die "queued resource $name is $state" ;; esac
    echo "tpu_pod.sh: queued resource $name is ${state:-not listed yet}; waiting for ACTIVE" >&2
    sleep 30
  done
}

ssh_all() {  # every worker of every node
  local node
  for node in "${nodes[@]}"; do run gcloud compute tpus tpu-vm ssh "$node" "${where[@]}" --worker=all --command "$1"; done
}

scp_all() {  # a local file to every worker of every node
  local node
  for node in "${nodes[@]}"; do run gcloud compute tpus tpu-vm scp "$1" "$node:$2" "${where[@]}" --worker=all; done
}

install() {
  # Replaces ~/trace-jax only. runs/ or artifacts/ left in it by an older layout (or by hand) are moved to
  # ~/trace-jax-runs, where train's relative paths now resolve, never deleted.
  local archive=/tmp/trace-jax-$$.tar.gz
  run git archive --format=tar.gz -o "$archive" HEAD
  scp_all "$archive" trace-jax.tar.gz
  ssh_all "set -e; mkdir -p $work_dir; for d in runs artifacts; do if [ -e $remote_dir/\$d ]; then \
if [ -e $work_dir/\$d ]; then echo \"install: ~/$remote_dir/\$d and ~/$work_dir/\$d both exist: merge them by \
hand\" >&2; exit 2; fi; mv $remote_dir/\$d $work_dir/; fi; done; \
rm -rf $remote_dir; mkdir -p $remote_dir; tar -xzf trace-jax.tar.gz -C $remote_dir; \
cd $remote_dir; python3 -m venv .venv; .venv/bin/pip install -q --upgrade pip; \
.venv/bin/pip install -q -e '.[gcs]' 'jax[tpu]'; .venv/bin/pip install -q --no-deps -r launch/no_deps.txt; \
.venv/bin/python -c 'import jax; print(jax.devices())'"
  [ "$dry" = 1 ] || rm -f "$archive"
}

train() {
  local cmd=("../$remote_dir/.venv/bin/trace-jax" train) pull=""
  [ "$smoke" = 1 ] && cmd+=(--smoke)
  [ "$resume" = 1 ] && cmd+=(--resume)
  [ "$multi_host" = 1 ] && cmd+=(--multi-host)
  if [ -n "$config" ]; then
    scp_all "$config" "$remote_dir/launch_config.yaml"
    cmd+=(--config "../$remote_dir/launch_config.yaml")
  fi
  cmd+=("${train_args[@]}")
  if [ -n "$staged" ]; then
    pull="gcloud storage rsync -r --delete-unmatched-destination-objects $(printf %q "${staged%/}/staged") staged && "
  fi
  local quoted
  quoted=$(printf '%q ' "${cmd[@]}")
  ssh_all "mkdir -p $work_dir/logs && cd $work_dir && ${pull}nohup $quoted > logs/$name.log 2>&1 &"
}

logs() {
  run gcloud compute tpus tpu-vm ssh "${nodes[0]}" "${where[@]}" --worker=0 \
    --command "tail -n +1 -F $work_dir/logs/$name.log"
}

delete() {
  if [ "$queued" = 1 ]; then
    run gcloud compute tpus queued-resources delete "$name" "${where[@]}" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$name" "${where[@]}" --quiet
  fi
}

case $command in
  create) create ;;
  install) install ;;
  train) train ;;
  logs) logs ;;
  delete) delete ;;
  up) create; wait_active; install; train; logs ;;
  *) die "unknown command '$command': use up, create, install, train, logs or delete" ;;
esac
