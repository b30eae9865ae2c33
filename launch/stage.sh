#!/usr/bin/env bash
# Stage a run's inputs in Cloud Storage before `up`, and print the `trace-jax train` overrides that use them.
#
#   bash launch/stage.sh --bucket gs://BUCKET/PATH [--policy DIR] [--search-qa DIR] [--env ENV] [--dry-run]
#
# Options:
#   --bucket gs://B/P  where the inputs go; each folder there is made a copy of its source (`gcloud storage rsync
#                      -r --delete-unmatched-destination-objects`: a file the source lacks is removed)
#   --policy DIR       the base policy, either
#                      - an orbax checkpoint directory (`trace-jax sft`'s out_dir/checkpoints: a folder per step)
#                        -> gs://B/P/init_checkpoint, read from the bucket by every host: init_checkpoint=gs://...
#                      - an HF Qwen3 checkpoint directory (config.json, safetensors, tokenizer)
#                        -> gs://B/P/staged/policy: search_qa.policy_dir=staged/policy (task.policy_dir with --env math)
#   --search-qa DIR    search QA data as `trace-jax data search-qa-tiny` writes it: qa/ (the questions,
#                      <dataset>/<split>.jsonl) and the retriever's corpus (corpus.jsonl, its BM25 index)
#                      -> gs://B/P/staged/search_qa: search_qa.qa_dir=staged/search_qa/qa
#   --env ENV          the family an HF policy is for: search_qa or math  [default search_qa]
#   --dry-run          print the gcloud commands instead of running them
#
# The overrides go to stdout, one a line, after the copies. trace-jax reads an HF policy and the QA files from
# local disk: `bash launch/tpu_pod.sh up|train --staged gs://B/P` copies gs://B/P/staged to staged/ in train's
# working directory (~/trace-jax-runs) on every worker before training, where those relative paths point.
set -euo pipefail

bucket=""
policy=""
search_qa=""
env=search_qa
dry=0

# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"  # usage, die, run

while [ $# -gt 0 ]; do
  case $1 in
    --bucket) bucket=${2:?--bucket needs a value}; shift 2 ;;
    --policy) policy=${2:?--policy needs a value}; shift 2 ;;
    --search-qa) search_qa=${2:?--search-qa needs a value}; shift 2 ;;
    --env) env=${2:?--env needs a value}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see: bash launch/stage.sh --help)" ;;
  esac
done
[ -n "$bucket" ] || die "--bucket is needed: the gs://BUCKET/PATH every host reads the inputs from"
[[ $bucket == gs://?* ]] || die "--bucket '$bucket' must be a Cloud Storage path, gs://BUCKET/PATH"
bucket=${bucket%/}
[ -n "$policy" ] || [ -n "$search_qa" ] || die "nothing to stage: pass --policy DIR, --search-qa DIR or both"
case $env in search_qa|math) ;; *) die "--env '$env' is not search_qa or math (the families with an HF policy)" ;; esac
[ -z "$search_qa" ] || [ "$env" = search_qa ] || die "--search-qa is search QA data: it goes with --env search_qa"

# Everything is checked before anything is copied.
policy_kind=""
if [ -n "$policy" ]; then
  [ -d "$policy" ] || die "--policy directory '$policy' not found"
  if [ -f "$policy/config.json" ]; then
    policy_kind=hf  # read from local disk
  elif compgen -G "$policy/[0-9]*/" > /dev/null; then
    policy_kind=orbax  # one folder per step, read from the bucket
  else
    die "--policy '$policy' holds neither an HF checkpoint (config.json) nor orbax checkpoints (a folder per" \
      "step, as in trace-jax sft's out_dir/checkpoints)"
  fi
fi
if [ -n "$search_qa" ]; then
  [ -d "$search_qa" ] || die "--search-qa directory '$search_qa' not found"
  [ -d "$search_qa/qa" ] || die "--search-qa '$search_qa' holds no qa/ folder (the questions:" \
    "qa/<dataset>/<split>.jsonl, as trace-jax data search-qa-tiny writes them)"
fi

overrides=()
copy() { run gcloud storage rsync -r --delete-unmatched-destination-objects "$1" "$bucket/$2"; }
if [ "$policy_kind" = hf ]; then
  copy "$policy" staged/policy
  key=search_qa.policy_dir
  [ "$env" = math ] && key=task.policy_dir
  overrides+=("$key=staged/policy")
elif [ "$policy_kind" = orbax ]; then
  copy "$policy" init_checkpoint
  overrides+=("init_checkpoint=$bucket/init_checkpoint")
fi
if [ -n "$search_qa" ]; then
  copy "$search_qa" staged/search_qa
  overrides+=("search_qa.qa_dir=staged/search_qa/qa")
fi

printf '%s\n' "${overrides[@]}"
if [[ ${overrides[*]} == *=staged/* ]]; then
  echo "stage.sh: trace-jax reads staged/ from local disk: pass --staged $bucket to tpu_pod.sh up/train, which" \
    "copies $bucket/staged to ~/trace-jax-runs/staged on every worker first" >&2
fi
if [ -n "$search_qa" ]; then
  echo "stage.sh: the retriever is not started here: serve the corpus (trace-jax retrieve serve --corpus" \
    "staged/search_qa/corpus.jsonl --port 8000 on each worker, or one server anywhere) and pass" \
    "search_qa.retriever.url=http://HOST:8000/retrieve when it is not on the worker itself" >&2
fi
