"""The Search-R1 / FlashRAG QA builder: JSONL and parquet from manual_dir, read back without TensorFlow."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trace_jax.data.search_qa_tfds import build_qa, read_qa

ROWS = [{"id": "a1", "question": "who wrote it?", "golden_answers": ["Ann", "Anne"], "data_source": "nq"},
        {"question": "where?", "golden_answers": "Paris"}]  # no id or source; one answer as a string


def test_jsonl_and_parquet_splits_round_trip(tmp_path):
    manual = tmp_path / "qa"
    (manual / "nq").mkdir(parents=True)
    (manual / "nq" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    pq.write_table(pa.Table.from_pylist([{**ROWS[0], "id": "t0"}]), manual / "nq" / "test.parquet")
    build_qa(tmp_path / "tfds", manual, "nq")
    train = sorted(read_qa(tmp_path / "tfds", "nq", "train"), key=lambda r: r["question"])
    assert train == [{"id": "1", "question": "where?", "golden_answers": ["Paris"], "data_source": "nq"},
                     {"id": "a1", "question": "who wrote it?", "golden_answers": ["Ann", "Anne"], "data_source": "nq"}]
    assert read_qa(tmp_path / "tfds", "nq", "test")[0]["id"] == "t0"
    with pytest.raises(ValueError, match=r"nq has no 'dev' split; it has \['test', 'train'\]"):
        read_qa(tmp_path / "tfds", "nq", "dev")


def test_missing_and_bad_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"(?s)no musique files in .*qa/musique; expected one or more of:.*"
                                                 r"musique/train.jsonl.*musique/test.parquet"):
        build_qa(tmp_path / "tfds", tmp_path / "qa", "musique")
    (tmp_path / "qa" / "popqa").mkdir(parents=True)
    (tmp_path / "qa" / "popqa" / "test.jsonl").write_text(json.dumps({"question": "q", "golden_answers": []}) + "\n")
    with pytest.raises(ValueError, match="row 0: needs a string `question` and a non-empty list"):
        build_qa(tmp_path / "tfds", tmp_path / "qa", "popqa")
    with pytest.raises(ValueError, match="unknown QA dataset 'squad'"):
        build_qa(tmp_path / "tfds", tmp_path / "qa", "squad")
    with pytest.raises(FileNotFoundError, match="is not built under"):
        read_qa(tmp_path / "elsewhere", "nq", "test")
