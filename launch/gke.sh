#!/usr/bin/env bash
# trace-jax on a GKE cluster with TPU node pools, as a JobSet (launch/gke/jobset.yaml).
#
#   bash launch/gke.sh build  --image IMAGE                        build this checkout's image and push it
#   bash launch/gke.sh render --image IMAGE [options] [-- key=value ...]   print the JobSet
#   bash launch/gke.sh apply  --image IMAGE [options] [-- key=value ...]   submit it (kubectl apply)
#   bash launch/gke.sh logs   [--name NAME]                        stream the training pod's log
#   bash launch/gke.sh delete [--name NAME]                        delete the JobSet
#
# Options:
#   --name NAME            JobSet name                        [default trace-jax]
#   --image IMAGE          container image, e.g. us-docker.pkg.dev/PROJECT/REPO/trace-jax:TAG
#   --accelerator TYPE     node selector gke-tpu-accelerator   [default tpu-v5-lite-podslice]
#   --topology TOPOLOGY    node selector gke-tpu-topology      [default 2x4: one v5e host, 8 chips]
#   --chips N              TPU chips each pod (host) asks for  [default 8]
#   --hosts N              hosts of the slice, one pod each     [default 1; > 1: a multi-host topology, the pods
#                          join through jax.distributed (train --multi-host) and need checkpoint_dir=gs://...
#                          or out_dir=gs://..., which every pod writes]
#   --max-restarts N       JobSet restarts after a failure     [default 3; a restart reruns the same command, which
#                          continues from the newest checkpoint when checkpoint_dir (or out_dir) is gs://...; on
#                          the pod's own disk the checkpoints go with the pod and it trains from scratch]
#   --config FILE          a YAML config from configs/ (baked into the image)
#   --smoke                `trace-jax train --smoke`: a few steps at the config's shapes on random weights
#   --dry-run              print the docker/kubectl commands instead of running them
# The cluster needs the JobSet controller (kubectl apply --server-side -f
# https://github.com/kubernetes-sigs/jobset/releases/download/v0.8.0/manifests.yaml) and a TPU node pool.
set -euo pipefail
cd "$(dirname "$0")/.."

name=trace-jax
image=""
accelerator=tpu-v5-lite-podslice
topology=2x4
chips=8
hosts=1
max_restarts=3
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
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --image) image=${2:?--image needs a value}; shift 2 ;;
    --accelerator) accelerator=${2:?--accelerator needs a value}; shift 2 ;;
    --topology) topology=${2:?--topology needs a value}; shift 2 ;;
    --chips) chips=${2:?--chips needs a value}; shift 2 ;;
    --hosts) hosts=${2:?--hosts needs a value}; shift 2 ;;
    --max-restarts) max_restarts=${2:?--max-restarts needs a value}; shift 2 ;;
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --smoke) smoke=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; overrides=("$@"); break ;;
    *) die "unknown option '$1' (see: bash launch/gke.sh --help)" ;;
  esac
done
[[ $chips =~ ^[0-9]+$ && $max_restarts =~ ^[0-9]+$ && $hosts =~ ^[1-9][0-9]*$ ]] ||
  die "--chips, --hosts and --max-restarts take whole numbers (--hosts at least 1)"
[[ $name =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "--name '$name' must be a DNS label (a-z, 0-9, -)"
if [ -n "$config" ] && [ ! -f "$config" ]; then
  die "config file '$config' not found (it must be in this checkout, which the image holds)"
fi
if [ "$hosts" -gt 1 ] && { [ "$command" = render ] || [ "$command" = apply ]; }; then
  [[ $(train_checkpoint_dir "$config" "${overrides[@]}") == gs://* ]] || die "--hosts $hosts: every pod writes" \
    "its shards of each checkpoint, so pass -- checkpoint_dir=gs://BUCKET/PATH (a path all pods reach)"
fi

need_image() { [ -n "$image" ] || die "$command needs --image (where the image is pushed)"; }

# The container's arguments as a YAML flow list of JSON strings:
# train [--smoke] [--multi-host] [--config F] key=value ...
args_list() {
  local args=(train) out="" a
  [ "$smoke" = 1 ] && args+=(--smoke)
  [ "$hosts" -gt 1 ] && args+=(--multi-host)
  [ -n "$config" ] && args+=(--config "$config")
  args+=("${overrides[@]}")
  for a in "${args[@]}"; do
    a=${a//\\/\\\\}
    out+="\"${a//\"/\\\"}\", "
  done
  echo "[${out%, }]"
}

render() {
  need_image
  local line args
  args=$(args_list)
  # shellcheck disable=SC2016  # the template's ${...} placeholders are literal text here
  while IFS= read -r line; do
    line=${line//'${NAME}'/$name}
    line=${line//'${IMAGE}'/$image}
    line=${line//'${TPU_ACCELERATOR}'/$accelerator}
    line=${line//'${TPU_TOPOLOGY}'/$topology}
    line=${line//'${TPU_CHIPS}'/$chips}
    line=${line//'${HOSTS}'/$hosts}
    line=${line//'${MAX_RESTARTS}'/$max_restarts}
    line=${line//'${ARGS}'/$args}
    printf '%s\n' "$line"
  done < launch/gke/jobset.yaml
}

case $command in
  build)
    need_image
    run docker build -f launch/gke/Dockerfile -t "$image" .
    run docker push "$image" ;;
  render) render ;;
  apply)
    need_image
    if [ "$dry" = 1 ]; then
      echo "kubectl apply -f - <<EOF"; render; echo "EOF"
    else
      render | kubectl apply -f -
    fi ;;
  logs) run kubectl logs -f --tail=-1 -l "jobset.sigs.k8s.io/jobset-name=$name" ;;
  delete) run kubectl delete jobset "$name" ;;
  *) die "unknown command '$command': use build, render, apply, logs or delete" ;;
esac
