"""The `trace-jax` command line: help, and export from an orbax checkpoint."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3ForCausalLM

from toy import TINY_POLICY
from trace_jax.checkpoints import load_model, save_model
from trace_jax.cli import main
from trace_jax.models import Policy

CFG = TINY_POLICY


def test_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "trace_jax.cli", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "export" in out


def test_orbax_checkpoint_round_trip(tmp_path):
    model = Policy(CFG, nnx.Rngs(3))
    save_model(tmp_path / "ckpt", 7, model)
    again = load_model(tmp_path / "ckpt")
    for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(again))):
        np.testing.assert_array_equal(a.get_value(), b.get_value(), err_msg=str(p))


def test_export_writes_a_transformers_checkpoint(tmp_path, capsys):
    model = Policy(CFG, nnx.Rngs(4))
    save_model(tmp_path / "ckpt", 2, model)
    assert main(["export", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 0
    assert "exported" in capsys.readouterr().out
    ref = Qwen3ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = np.arange(9).reshape(1, 9)
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    assert np.abs(np.asarray(model(ids).logits) - expected).max() <= 1e-4
    assert (tmp_path / "hf" / "success_head.safetensors").is_file()


def test_export_of_a_missing_checkpoint_fails_clearly(tmp_path, capsys):
    assert main(["export", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "hf")]) == 2
    assert "no checkpoint directory" in capsys.readouterr().err
    save_model(tmp_path / "ckpt", 1, Policy(CFG, nnx.Rngs(0)))
    assert main(["export", "--checkpoint", str(tmp_path / "ckpt"), "--step", "5", "--out",
                 str(tmp_path / "hf")]) == 2
    assert "available steps: [1]" in capsys.readouterr().err


def test_data_show_renders_expert_and_policy_episodes(tmp_path, capsys):

    assert main(["data", "show", "--question", "3", "--mistake-prob", "0"]) == 0
    expert = capsys.readouterr().out
    assert expert.startswith("<|im_start|> user") and expert.rstrip().endswith("reward: 1.0")
    save_model(tmp_path / "policy", 0, Policy(TINY_POLICY, nnx.Rngs(0)))
    assert main(["data", "show", "--question", "3", "--checkpoint", str(tmp_path / "policy")]) == 0
    sampled = capsys.readouterr().out
    assert sampled.startswith("<|im_start|> user") and "(answer: " in sampled
    assert main(["data", "show", "--question", "99999"]) == 2
    assert "--question must be in" in capsys.readouterr().err


def test_bench_flags_reject_bad_numbers_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "solver", "--roots", "512,x"])
    err = capsys.readouterr().err
    assert "argument --roots: invalid comma-separated list of positive integers value: '512,x'" in err
    with pytest.raises(SystemExit):
        main(["bench", "sampler", "--repeats", "0"])
    assert "argument --repeats: invalid positive integer value: '0'" in capsys.readouterr().err


def test_a_mesh_the_devices_cannot_fill_fails_before_any_work_or_folder(tmp_path, capsys):
    """`mesh.data=4` on one device: the error names the devices, and neither the dataset nor the run's folder (with
    a config.yaml that would look like a run's) was made."""
    data, out = tmp_path / "tfds", tmp_path / "run"
    assert main(["train", "mesh.data=4", f"data_dir={data}", f"out_dir={out}",
                 f"init_checkpoint={tmp_path / 'sft'}"]) == 2
    assert "mesh data*fsdp*tensor = 4 but 1 devices are available" in capsys.readouterr().err
    assert not data.exists() and not out.exists() and not (tmp_path / "sft").exists()


QUIET = """
import sys
from trace_jax.cli import main
code = main(["data", "build", "--data-dir", sys.argv[1], "world.num_entities=32", "world.num_questions=40"])
from transformers.utils import logging
logging.get_logger("transformers").warning_advice("PyTorch was not found.")  # transformers' own advisory path
sys.exit(code)
"""


def test_a_command_says_what_it_does_without_tfds_absl_or_transformers_notices(tmp_path):
    """Building a dataset prints our line, not TFDS's "Downloading and preparing dataset" (nothing is downloaded)
    nor absl's warnings before it; transformers' advisory notices (its "PyTorch was not found" where torch is not
    installed) are off."""
    done = subprocess.run([sys.executable, "-c", QUIET, str(tmp_path / "tfds")], capture_output=True, text=True,
                          timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "building the HopWorld dataset" in done.stdout
    for notice in ("Downloading and preparing", "downloaded and prepared", "WARNING:absl", "PyTorch was not found"):
        assert notice not in said, notice
