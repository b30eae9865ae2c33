"""Math problems through TFDS from DeepScaleR-format files (JSON lists, JSON lines, parquet), evaluation problems
kept out of training, clear errors for bad files; the kit's answers (sympy) agree with what its programs print."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trace_jax.envs.math.dataset import build_problems, find_files, read_problems
from trace_jax.envs.math.problems import generate
from trace_jax.envs.math.sandbox import SandboxConfig, SandboxPool
from trace_jax.envs.math.verifier import Verifier


def write(tmp_path, train, **evals):
    root = tmp_path / "problems"
    (root / "eval").mkdir(parents=True)
    (root / "train.json").write_text(json.dumps(train))  # DeepScaleR ships one JSON list
    for name, rows in evals.items():
        if name.endswith("_parquet"):
            pq.write_table(pa.Table.from_pylist(rows), root / "eval" / f"{name[:-8]}.parquet")
        else:
            (root / "eval" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_splits_from_every_format_with_evaluation_problems_out_of_training(tmp_path, capsys):
    train = [{"problem": "What is 1+1?", "answer": "2", "solution": "1+1=2"},
             {"problem": "What is  2 + 2?", "answer": 4},  # a number, and a copy of an AIME problem
             {"problem": "Find x.", "answer": "\\frac{1}{2}", "unique_id": "u7"}]
    root = write(tmp_path, train, aime24=[{"id": "a1", "problem": "what is 2 + 2?", "answer": "4"}],
                 amc23_parquet=[{"problem": "What is 3*3?", "answer": "9"}])
    assert build_problems(tmp_path / "tfds", root) == ["train", "aime24", "amc23"]
    assert "dropped 1 training problems that are in an evaluation set" in capsys.readouterr().out
    got = sorted(read_problems(tmp_path / "tfds", root, "train"), key=lambda r: r["id"])
    assert got == [{"id": "train-0", "problem": "What is 1+1?", "answer": "2", "solution": "1+1=2"},
                   {"id": "u7", "problem": "Find x.", "answer": "\\frac{1}{2}", "solution": ""}]
    assert read_problems(tmp_path / "tfds", root, "amc23") == [
        {"id": "amc23-0", "problem": "What is 3*3?", "answer": "9", "solution": ""}]
    with pytest.raises(ValueError, match="no 'math500' split"):
        read_problems(tmp_path / "tfds", root, "math500")

    (root / "eval" / "aime24.jsonl").write_text(json.dumps({"problem": "Other?", "answer": "1"}) + "\n")
    build_problems(tmp_path / "tfds", root)  # a changed file builds anew
    assert len(read_problems(tmp_path / "tfds", root, "train")) == 3


def test_bad_files_are_named_with_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected train.jsonl, train.json or train.parquet"):
        find_files(tmp_path)
    root = write(tmp_path, [{"problem": "p", "answer": "1"}], **{"math-500": [{"problem": "q", "answer": "2"}]})
    with pytest.raises(ValueError, match=r"name must be a Python identifier.*math_500\.jsonl"):
        find_files(root)
    (root / "eval" / "math-500.jsonl").unlink()
    (root / "train.json").write_text(json.dumps([{"problem": "p"}]))
    with pytest.raises(ValueError, match=r"train.json row 0: needs a non-empty string `problem` and an `answer`"):
        build_problems(tmp_path / "tfds", root)
    (root / "train.json").write_text('{"problem": "p", "answer": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"train.json:2: not JSON"):
        build_problems(tmp_path / "tfds", root)


def test_the_kits_answers_are_what_its_programs_print():
    """Two computations apart: the answer from sympy in the generator, the value the scripted program prints in the
    sandbox; the verifier must match every pair (and a wrong answer must not)."""
    problems = generate(24, seed=5)
    with SandboxPool(SandboxConfig(workers=2)) as pool, Verifier(workers=1) as verifier:
        results = pool.run_many([[p.code] for p in problems])
        assert all(r.status == "ok" for r in results)
        printed = [f"\\boxed{{{r.output.strip()}}}" for r in results]
        assert verifier.scores([p.answer for p in problems], printed) == [1.0] * 24
        assert verifier.scores([p.answer + "+1" for p in problems], printed) == [0.0] * 24
