"""The sandbox is a security boundary: every hostile program of the battery gets a short observation of its own,
and the host is as it was afterwards (its files, its processes, the sandbox's folder, the workers)."""

import hashlib
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from trace_jax.envs.math.sandbox import Result, SandboxConfig, SandboxPool, observation

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
CFG = SandboxConfig(workers=2, cpu_s=1, wall_s=2.0, memory_mb=256, file_mb=1, disk_mb=8, output_bytes=2048)
SECRET = "TRACE_JAX_TEST_SECRET"


@pytest.fixture(scope="module")
def pool():
    os.environ[SECRET] = "hunter2"  # the trainer's environment: no program may see it
    try:
        with SandboxPool(CFG) as p:
            yield p
    finally:
        del os.environ[SECRET]


def battery(canary: Path, checkpoint: Path, port: int) -> list[tuple[str, str, set[str], str]]:
    """(name, program, allowed statuses, text its observation must hold)."""
    new = canary.parent / "created_by_sandbox"
    return [
        ("infinite loop", "while True: pass", {"timeout"}, "Timeout"),
        ("sleep past the wall clock", "import time; time.sleep(60)", {"timeout"}, "Timeout"),
        ("one huge allocation", "x = bytearray(1 << 34)", {"memory"}, "MemoryError"),
        ("memory growing", "a = []\nwhile True: a.append(bytearray(1 << 20))", {"memory"}, "MemoryError"),
        ("fork bomb", "import os\nwhile True: os.fork()", {"error"}, "Operation not permitted"),
        ("fork through libc", "import ctypes; print(ctypes.CDLL(None).fork())", {"ok"}, "-1"),
        ("subprocess", f"import subprocess; subprocess.run(['touch', {str(new)!r}])", {"error"},
         "Operation not permitted"),
        ("os.system", f"import os; print(os.system('touch {new}'))", {"ok"}, ""),
        ("tcp connect", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)", {"error"},
         "Operation not permitted"),
        ("udp socket", "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)", {"error"},
         "Operation not permitted"),
        ("read the project", f"print(open({str(README)!r}).read())", {"error"}, "Permission denied"),
        ("read a checkpoint", f"print(open({str(checkpoint)!r}, 'rb').read())", {"error"}, "Permission denied"),
        ("delete outside", f"import os; os.remove({str(canary)!r})", {"error"}, "Permission denied"),
        ("rename outside", f"import os; os.rename({str(canary)!r}, {str(new)!r})", {"error"}, "Permission denied"),
        ("write outside", f"open({str(new)!r}, 'w').write('x')", {"error"}, "Permission denied"),
        ("symlink out", f"import os; os.symlink({str(canary)!r}, 'l'); print(open('l').read())", {"error"},
         "Permission denied"),
        ("hard link outside", f"import os; os.link({str(canary)!r}, {str(new)!r})", {"error"}, "Permission denied"),
        ("list /", "import os; print(os.listdir('/'))", {"error"}, "Permission denied"),
        ("walk up", "import os; os.chdir('..'); print(os.listdir('.'))", {"error"}, "Permission denied"),
        ("the parent's environment", "import os; print(open(f'/proc/{os.getppid()}/environ').read())", {"error"},
         "Permission denied"),
        ("kill the worker", "import os, signal; os.kill(os.getppid(), signal.SIGKILL)", {"error"},
         "Operation not permitted"),
        ("kill the trainer", f"import os, signal; os.kill({os.getpid()}, signal.SIGKILL)", {"error"},
         "Operation not permitted"),
        ("mount over its folder", "import ctypes; print(ctypes.CDLL(None).mount(b'x', b'.', b'tmpfs', 0, None))",
         {"ok"}, "-1"),
        ("megabytes of output", "print('x' * 10**7)", {"output_limit"}, "Output limit"),
        ("a file past file_mb", "open('f', 'wb').write(b'x' * (2 << 20))", {"error"}, "File too large"),
        ("filling the disk", "for i in range(64): open(f'f{i}', 'wb').write(b'x' * (1 << 20))", {"error"},
         "No space left"),
        ("segfault", "import ctypes; ctypes.string_at(0)", {"killed"}, "SIGSEGV"),
        ("thread bomb", "import threading, time\nfor _ in range(100000): "
         "threading.Thread(target=time.sleep, args=(60,)).start()", {"error", "memory", "timeout"}, ""),
        ("its own exit code", "import os; os._exit(7)", {"error"}, "exited with code 7"),
        ("closing its output, then looping", "import os\nos.close(1); os.close(2)\nwhile True: pass", {"timeout"},
         "Timeout"),
        ("recursion", "def f(): return f()\nf()", {"error"}, "RecursionError"),
        ("syntax error", "def f(:", {"error"}, "SyntaxError"),
        ("null bytes", "exec('\\x00')", {"error"}, "null bytes"),
        ("secrets in the environment", "import os; print(sorted(os.environ))", {"ok"},
         "['HOME', 'LANG', 'PYTHONHASHSEED', 'TMPDIR']"),
    ]


def tracked_files() -> dict[str, tuple[int, int]]:
    """Every file git tracks in the project: (size, mtime in ns)."""
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return {n: (s.st_size, s.st_mtime_ns) for n in names if (s := (ROOT / n).stat())}


def children_of(pids: list[int]) -> list[int]:
    """Live processes whose parent is one of pids."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) in pids and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def settled(check, seconds: float = 20.0):
    """check()'s first truthy value, polled until `seconds` have passed (then its last, falsy one)."""
    deadline = time.monotonic() + seconds
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def test_each_hostile_program_gets_its_observation_and_leaves_the_host_as_it_was(pool, tmp_path):
    canary, checkpoint = tmp_path / "canary.txt", tmp_path / "checkpoints" / "0" / "params"
    canary.write_text("keep me")
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights")
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.rglob("*") if p.is_file()}
    project = tracked_files()
    server = socket.create_server(("127.0.0.1", 0))  # a connection would be accepted if one got through
    server.settimeout(0.1)
    cases = battery(canary, checkpoint, server.getsockname()[1])
    assert len(cases) >= 20

    results = pool.run_many([[program] for _, program, _, _ in cases])

    for (name, _, statuses, text), result in zip(cases, results):
        seen = observation(result, CFG)
        assert result.status in statuses and text in seen, (name, result)
        assert len(seen) <= CFG.observation_chars + 200, name  # short, whatever the program printed
    assert "hunter2" not in "".join(r.output for r in results)
    with pytest.raises(TimeoutError):
        server.accept()
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # nothing created, changed or deleted outside the sandbox
    assert tracked_files() == project
    # A worker cleans up and forks its next child after it answers, so on a loaded machine the last programs' may
    # still be under way when run_many returns: give it until a deadline to settle.

    def folders_left() -> list[Path]:  # every program's folder removed: left, each worker's next child's
        folders = list(Path(pool.root).iterdir())
        return folders if len(folders) == CFG.workers and not any(any(f.iterdir()) for f in folders) else []

    def waiting() -> list[int]:  # no process left behind: each worker's next child, waiting alone
        children = children_of(pool.workers.pids())
        return children if len(children) == CFG.workers and children_of(children) == [] else []

    assert settled(folders_left), list(Path(pool.root).rglob("*"))
    assert settled(waiting), children_of(pool.workers.pids())
    assert pool.workers.restarts == 0  # no program could take its worker down
    assert pool.run(["print(6 * 7)"]) == Result("ok", "42\n")


def test_cells_see_the_earlier_cells_variables_and_only_the_last_cell_speaks(pool):
    cells = ["x = 5\nprint('not shown')", "y = undefined_name", "y = x * 2", "print(x + y)"]
    assert pool.run(cells) == Result("ok", "15\n")
    assert pool.run(["import sympy as sp", "print(sp.factorint(360))"]) == Result("ok", "{2: 3, 3: 2, 5: 1}\n")
    assert pool.run(["z = 1", "print(z / 0)"]).output == "line 1: ZeroDivisionError: division by zero\n"


def test_programs_run_concurrently_and_answer_in_order(pool):
    start = time.monotonic()
    results = pool.run_many([[f"import time; time.sleep(0.5); print({i})"] for i in range(4)])
    assert [r.output for r in results] == [f"{i}\n" for i in range(4)]
    assert time.monotonic() - start < 1.9  # two workers: two rounds of 0.5 s, not four


def test_a_worker_that_dies_costs_its_program_alone(pool):
    victim = pool.workers.pids()
    killer = threading.Timer(0.5, lambda: [os.kill(pid, 9) for pid in victim])
    killer.start()
    results = pool.run_many([["import time; time.sleep(1.5); print('done')"]] * 2)
    killer.join()
    assert [r.status for r in results] == ["sandbox_error"] * 2
    assert "worker died" in observation(results[0], CFG)
    assert pool.workers.restarts >= 2 and sorted(pool.workers.pids()) != sorted(victim)
    assert pool.run(["print('still serving')"]) == Result("ok", "still serving\n")


def test_sandbox_run_prints_what_the_policy_would_read(tmp_path, capsys):
    from trace_jax.cli import main

    (tmp_path / "a.py").write_text("x = 6\nprint('replayed, not shown')\n")
    (tmp_path / "b.py").write_text("print(x * 7)\nopen('/etc/hostname', 'a')\n")
    assert main(["sandbox", "run", str(tmp_path / "a.py"), str(tmp_path / "b.py"), "--cpu-s", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("42\nline 2: PermissionError") and out.endswith("(status: error)\n")
    assert "replayed" not in out


def test_bench_sandbox_runs_the_kits_programs(capsys):
    from trace_jax.bench.sandbox import run_sandbox_bench

    got = run_sandbox_bench(programs=8, workers=1, repeats=1)
    assert got["sandbox_programs_per_s"] > 0 and got["workers"] == 1
    assert "programs/s" in capsys.readouterr().out
