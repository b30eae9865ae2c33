"""`trace-jax retrieve index` and `trace-jax retrieve serve` as a user runs them."""

import json
import socket
import subprocess
import sys
import urllib.request

from trace_jax.cli import main


def test_index_then_serve_a_corpus(corpus, tmp_path, capsys):
    path, docs = corpus
    assert main(["retrieve", "index", "--corpus", str(path), "--index", str(tmp_path / "idx")]) == 0
    assert "serve it with `trace-jax retrieve serve --index" in capsys.readouterr().out
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "trace_jax.cli", "retrieve", "serve", "--index",
                               str(tmp_path / "idx"), "--port", str(port), "--topk", "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert f"serving {len(docs)} passages" in server.stdout.readline()
        body = json.dumps({"queries": ["waa"], "return_scores": False}).encode()
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/retrieve", data=body),
                                    timeout=30) as r:
            result = json.loads(r.read())["result"]
        assert len(result) == 1 and len(result[0]) == 2 and result[0][0] in docs  # --topk is the default k
    finally:
        server.terminate()
        server.wait()
    assert main(["retrieve", "serve"]) == 2  # neither --index nor --corpus
    assert "give exactly one of --index DIR" in capsys.readouterr().err
