"""What a run's process loads: the training loop, the comparison and the evaluation start without PyTorch and
transformers (together ~5 s of every process's start where they are installed, as on Colab and in this suite's
environment); SFT loads transformers when it builds its tokenizer."""

import subprocess
import sys

LOAD = """
import sys
import trace_jax.compare.run, trace_jax.evaluate, trace_jax.show_tree, trace_jax.train.loop
print(sorted(name for name in ("torch", "transformers") if name in sys.modules))
import torch  # tensorboardX was loaded as if PyTorch were absent: it is importable again after
print(torch.ones(2).sum().item())
"""


def test_the_training_loop_starts_without_pytorch_or_transformers():
    out = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "2.0"], out
