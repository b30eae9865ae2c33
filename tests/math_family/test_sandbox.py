"""The sandbox is a security boundary: every hostile program of the battery gets a short observation of its own,
and the host is as it was afterwards (its files, other processes' limits, scheduling and liveness, IPC objects, the
clock, the sandbox's folder, the workers, no process left), on this kernel's Landlock ABI and on each older one."""

import dataclasses
import hashlib
import os
import platform
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trace_jax.envs.math.lockdown import landlock_abi
from trace_jax.envs.math.sandbox import Result, SandboxConfig, SandboxPool, observation

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
CFG = SandboxConfig(workers=2, cpu_s=1, wall_s=2.0, memory_mb=256, file_mb=1, disk_mb=8, output_bytes=2048)
SECRET = "TRACE_JAX_TEST_SECRET"
NR = {  # the raw system calls the battery makes (asm/unistd_64.h; asm-generic/unistd.h for aarch64)
    "x86_64": dict(rt_tgsigqueueinfo=297, tgkill=234, pidfd_send_signal=424, ioprio_set=251, process_vm_readv=310,
                   kcmp=312, mq_open=240, add_key=248, keyctl=250, userfaultfd=323, io_uring_setup=425,
                   perf_event_open=298, bpf=321, syslog=103, unshare=272, fsopen=430, open_by_handle_at=304,
                   clone=56, iopl=172),
    "aarch64": dict(rt_tgsigqueueinfo=240, tgkill=131, pidfd_send_signal=424, ioprio_set=30, process_vm_readv=270,
                    kcmp=272, mq_open=180, add_key=217, keyctl=219, userfaultfd=282, io_uring_setup=425,
                    perf_event_open=241, bpf=280, syslog=116, unshare=97, fsopen=430, open_by_handle_at=265,
                    clone=220),
}.get(platform.machine(), {})
SYSCALL = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
           "def sc(*args):\n    got = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))\n"
           "    print(got, os.strerror(ctypes.get_errno()) if got < 0 else 'succeeded')\n")
DENIED = ("error", "Operation not permitted")  # seccomp's answer: EPERM
REFUSED = ("ok", "-1 Operation not permitted")  # the same, through ctypes


@pytest.fixture(scope="module")
def pool():
    os.environ[SECRET] = "hunter2"  # the trainer's environment: no program may see it
    try:
        with SandboxPool(CFG) as p:
            yield p
    finally:
        del os.environ[SECRET]


@pytest.fixture(scope="module")
def victim():
    """Another process of the same user, as the trainer's data loaders or a second job would be."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def battery(canary: Path, checkpoint: Path, port: int, victim: int, pids: list[int], abi: int, private: bool
            ) -> list[tuple[str, str, set[str], str | tuple[str, ...]]]:
    """(name, program, allowed statuses, text its observation must hold, or texts one of which it must). pids: the
    host's processes; abi: the Landlock ABI the sandbox uses; private: whether it has namespaces of its own."""
    new = canary.parent / "created_by_sandbox"
    trainer, uid = os.getpid(), os.getuid()
    hidden = "No such file" if private else "Permission denied"  # /proc: covered, or closed by Landlock
    own = [
        ("infinite loop", "while True: pass", {"timeout"}, "Timeout"),
        ("sleep past the wall clock", "import time; time.sleep(60)", {"timeout"}, "Timeout"),
        ("one huge allocation", "x = bytearray(1 << 34)", {"memory"}, "MemoryError"),
        ("memory growing", "a = []\nwhile True: a.append(bytes(1 << 20))", {"memory"}, "MemoryError"),  # calloc
        ("raise its own limits", "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", {"error"},
         "not allowed to raise"),
        ("fork bomb", "import os\nwhile True: os.fork()", {"error"}, "Operation not permitted"),
        ("fork through libc", "import ctypes; print(ctypes.CDLL(None).fork())", {"ok"}, "-1"),
        ("subprocess", f"import subprocess; subprocess.run(['touch', {str(new)!r}])", {"error"},
         "Operation not permitted"),
        ("os.system", f"import os; print(os.system('touch {new}'))", {"ok"}, ""),
        ("a thread", "import threading; threading.Thread(target=print).start()", {"error"}, "can't start new thread"),
        ("thread bomb", "import threading, time\nfor _ in range(100000): "
         "threading.Thread(target=time.sleep, args=(60,)).start()", {"error"}, "can't start new thread"),
        ("a thread through clone", f"{SYSCALL}sc({NR.get('clone')}, 0x10f00, 0, 0, 0, 0)", *REFUSED),
        ("leave its process group", "import os; os.setpgid(0, 0)", *DENIED),
        ("a session of its own", "import os; os.setsid()", *DENIED),
        ("its own exit code", "import os; os._exit(7)", {"error"}, "exited with code 7"),
        ("forge its status on inherited descriptors", "import os, struct\nfor fd in range(3, 1024):\n    try:\n"
         "        os.write(fd, struct.pack('i', 0))\n    except OSError:\n        pass\nos._exit(9)",
         {"error"}, "exited with code 9"),
        ("descriptors it inherited: its record pipe's write end alone",
         "import fcntl, os, stat\nfds = []\nfor fd in range(3, 1024):\n    try:\n"
         "        fds.append((stat.S_ISFIFO(os.fstat(fd).st_mode), fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE"
         " == os.O_WRONLY))\n    except OSError:\n        pass\nprint('fds', fds)",
         {"ok"}, "fds [(True, True)]"),
        ("closing its output, then looping", "import os\nos.close(1); os.close(2)\nwhile True: pass", {"timeout"},
         "Timeout"),
        ("megabytes of output", "print('x' * 10**7)", {"output_limit"}, "Output limit"),
        ("a file past file_mb", "open('f', 'wb').write(b'x' * (2 << 20))", {"error"}, "File too large"),
        ("filling the disk", "for i in range(64): open(f'f{i}', 'wb').write(b'x' * (1 << 20))", {"error"},
         "No space left"),
        ("rename between its own folders", "import os\nos.mkdir('a'); os.mkdir('b'); open('a/f', 'w').close()\n"
         "os.rename('a/f', 'b/f'); print('moved')", *(("error", "cross-device") if abi == 1 else ("ok", "moved"))),
        ("segfault", "import ctypes; ctypes.string_at(0)", {"killed"}, "SIGSEGV"),
        ("recursion", "def f(): return f()\nf()", {"error"}, "RecursionError"),
        ("deep nesting", "eval('(' * 100000 + ')' * 100000)", {"error", "memory", "output_limit"}, ""),
        ("a 4 MB program", "s = '" + "x" * (4 << 20) + "'\nprint(len(s))", {"ok"}, str(4 << 20)),
        ("syntax error", "def f(:", {"error"}, "SyntaxError"),
        ("null bytes", "exec('\\x00')", {"error"}, "null bytes"),
        ("many files in its folder", "import os\nfor i in range(20000): os.close(os.open(f'{i:0200}', os.O_CREAT))",
         *(("error", "No space left") if private else ("ok", ""))),
        ("many POSIX timers", "import ctypes\nlibc = ctypes.CDLL(None)\nevent = ctypes.create_string_buffer(64)\n"
         "event[12] = 1\ntimer = ctypes.c_void_p()\nn = 0\n"
         "while n < 1000 and libc.timer_create(1, event, ctypes.byref(timer)) == 0: n += 1\n"
         "print('bounded' if n <= 16 else f'{n} timers')", {"ok"}, "bounded"),
        ("secrets in the environment", "import os; print(sorted(os.environ))", {"ok"},
         "['HOME', 'LANG', 'PYTHONHASHSEED', 'TMPDIR']"),
    ]
    files = [
        ("read the project", f"print(open({str(README)!r}).read())", {"error"}, "Permission denied"),
        ("read a checkpoint", f"print(open({str(checkpoint)!r}, 'rb').read())", {"error"}, "Permission denied"),
        ("delete outside", f"import os; os.remove({str(canary)!r})", {"error"}, "Permission denied"),
        ("rename outside", f"import os; os.rename({str(canary)!r}, {str(new)!r})", {"error"}, "Permission denied"),
        ("write outside", f"open({str(new)!r}, 'w').write('x')", {"error"}, "Permission denied"),
        ("truncate outside", f"import os; os.truncate({str(canary)!r}, 0)", *DENIED),
        ("truncate outside by opening", f"open({str(canary)!r}, 'w')", {"error"}, "Permission denied"),
        ("symlink out", f"import os; os.symlink({str(canary)!r}, 'l'); print(open('l').read())", {"error"},
         "Permission denied"),
        ("hard link outside", f"import os; os.link({str(canary)!r}, {str(new)!r})", {"error"}, "Permission denied"),
        ("list /", "import os; print(os.listdir('/'))", {"error"}, "Permission denied"),
        ("walk up", "import os; os.chdir('..'); print(os.listdir('.'))", {"error"}, "Permission denied"),
        ("chmod a host file", f"import os; os.chmod({str(canary)!r}, 0o4777)", *DENIED),
        ("utime a host file", f"import os; os.utime({str(canary)!r}, (0, 123456789))", *DENIED),
        ("an extended attribute on a host file", f"import os; os.setxattr({str(canary)!r}, 'user.memo', b'x')",
         *DENIED),
        ("chmod a library file it may read", "import os; fd = os.open(os.__file__, os.O_RDONLY)\n"
         "os.fchmod(fd, os.stat(fd).st_mode & 0o7777)", *DENIED),
        ("inode flags of a library file", "import fcntl, os, struct; fd = os.open(os.__file__, os.O_RDONLY)\n"
         "fcntl.ioctl(fd, 0x40086602, struct.pack('l', 0))", *DENIED),
        ("a lease on a library file", "import fcntl, os; fd = os.open(os.__file__, os.O_RDONLY)\n"
         "fcntl.fcntl(fd, 1024, fcntl.F_RDLCK)", *DENIED),
        ("flock a library file", "import fcntl, os; fd = os.open(os.__file__, os.O_RDONLY)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)", *DENIED),
        ("inotify", "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
         "print(libc.inotify_init1(0), os.strerror(ctypes.get_errno()))", *REFUSED),
        ("the host's mount table", f"{SYSCALL}sc(458, b'\\0' * 32, 0, 0, 0)", *REFUSED),
        ("chown, a capability", "import os; open('f', 'w').close(); os.chown('f', 1234, 1234)", {"error"},
         ("Operation not permitted", "Invalid argument")),  # EINVAL: 1234 is not mapped in a user namespace
        ("file handles", f"{SYSCALL}sc({NR.get('open_by_handle_at')}, -100, b'x' * 16, 0)", *REFUSED),
        ("mount over its folder", "import ctypes; print(ctypes.CDLL(None).mount(b'x', b'.', b'tmpfs', 0, None))",
         {"ok"}, "-1"),
        ("the new mount API", f"{SYSCALL}sc({NR.get('fsopen')}, b'tmpfs', 0)", *REFUSED),
        ("a user namespace", f"{SYSCALL}sc({NR.get('unshare')}, 0x10000000)", *REFUSED),
    ]
    processes = [
        ("stat the host's processes", "import os\n"
         f"print('seen', [p for p in {[1, victim, trainer]} + [os.getppid()] if os.path.exists(f'/proc/{{p}}')])",
         {"ok"}, "seen []" if private else "seen"),
        ("the standby's status pipe", "import os, struct\nopened = 0\nfor fd in range(64):\n    try:\n"
         "        f = os.open(f'/proc/{os.getppid()}/fd/{fd}', os.O_WRONLY)\n"
         "        os.write(f, struct.pack('i', 0))\n        opened += 1\n    except OSError:\n        pass\n"
         "print('opened', opened)\nraise ValueError('its own end')", {"error"}, "opened 0"),
        ("the parent's environment", "import os; print(open(f'/proc/{os.getppid()}/environ').read())", {"error"},
         hidden),
        ("another process's memory", f"open('/proc/{victim}/mem', 'rb')", {"error"}, hidden),
        ("another process's descriptors", f"import os; os.listdir('/proc/{victim}/fd')", {"error"}, hidden),
        ("kill the worker", "import os, signal; os.kill(os.getppid(), signal.SIGKILL)", *DENIED),
        ("kill the trainer", f"import os, signal; os.kill({trainer}, signal.SIGKILL)", *DENIED),
        ("sigqueue", f"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
         f"print(libc.sigqueue({victim}, 15, 0), os.strerror(ctypes.get_errno()))", *REFUSED),
        ("rt_tgsigqueueinfo", f"{SYSCALL}sc({NR.get('rt_tgsigqueueinfo')}, {victim}, {victim}, 15, b'\\0' * 128)",
         *REFUSED),
        ("tgkill another process", f"{SYSCALL}sc({NR.get('tgkill')}, {victim}, {victim}, 15)", *REFUSED),
        ("a pidfd", f"import os; os.pidfd_open({victim})", *DENIED),
        ("pidfd_send_signal", f"{SYSCALL}sc({NR.get('pidfd_send_signal')}, 0, 15, 0, 0)", *REFUSED),
        ("SIGIO to another process", f"import fcntl, os\nr, w = os.pipe()\nfcntl.fcntl(r, fcntl.F_SETOWN, {victim})",
         *DENIED),
        ("SIGIO's signal", "import fcntl, os\nr, w = os.pipe()\nfcntl.fcntl(r, fcntl.F_SETSIG, 9)", *DENIED),
        ("SIGIO owner through F_SETOWN_EX", f"import fcntl, os, struct\nr, w = os.pipe()\n"
         f"fcntl.fcntl(r, 15, struct.pack('ii', 1, {victim}))", *DENIED),
        ("SIGIO owner through ioctl", f"import fcntl, os, struct\nr, w = os.pipe()\n"
         f"fcntl.ioctl(r, 0x8901, struct.pack('i', {victim}))", *DENIED),
        ("prlimit another process", f"import resource; resource.prlimit({victim}, resource.RLIMIT_NOFILE, (4, 4))",
         *DENIED),
        ("prlimit the trainer", f"import resource; resource.prlimit({trainer}, resource.RLIMIT_CPU, (1, 1))",
         *DENIED),
        ("read another process's limits", f"import resource; resource.prlimit({victim}, resource.RLIMIT_NOFILE)",
         *DENIED),
        ("find the host's processes", "import os, resource\nseen = set()\n"
         f"for p in {[*pids, 4194300]}:\n"
         "    for probe in (os.getpgid, os.getsid, os.sched_getscheduler, os.sched_getparam, os.sched_getaffinity,\n"
         "                  lambda p: os.getpriority(os.PRIO_PROCESS, p),\n"
         "                  lambda p: resource.prlimit(p, resource.RLIMIT_CPU)):\n"
         "        try:\n            probe(p)\n            seen.add('found')\n"
         "        except OSError as e:\n            seen.add(type(e).__name__)\nprint(sorted(seen))",
         {"ok"}, "['PermissionError']"),
        ("renice the user's processes", f"import os; os.setpriority(os.PRIO_USER, {uid}, 19)", *DENIED),
        ("renice another process", f"import os; os.setpriority(os.PRIO_PROCESS, {victim}, 19)", *DENIED),
        ("real-time scheduling", "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))", *DENIED),
        ("another process's scheduling", f"import os; os.sched_setscheduler({victim}, os.SCHED_IDLE, "
         "os.sched_param(0))", *DENIED),
        ("pin another process", f"import os; os.sched_setaffinity({victim}, {{0}})", *DENIED),
        ("the user's I/O priority", f"{SYSCALL}sc({NR.get('ioprio_set')}, 3, {uid}, 3 << 13)", *REFUSED),
        ("ptrace", f"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
         f"print(libc.ptrace(16, {victim}, 0, 0), os.strerror(ctypes.get_errno()))", *REFUSED),
        ("process_vm_readv", f"{SYSCALL}sc({NR.get('process_vm_readv')}, {victim}, 0, 0, 0, 0, 0)", *REFUSED),
        ("kcmp", f"{SYSCALL}sc({NR.get('kcmp')}, {victim}, {trainer}, 0, 0, 0)", *REFUSED),
        ("perf_event_open", f"{SYSCALL}sc({NR.get('perf_event_open')}, b'\\0' * 128, {victim}, -1, -1, 0)",
         *REFUSED),
    ]
    kernel = [
        ("System V shared memory", "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
         "print(libc.shmget(0, 100 << 20, 0o1600), os.strerror(ctypes.get_errno()))", *REFUSED),
        ("System V message queue", "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
         "print(libc.msgget(0, 0o1600), os.strerror(ctypes.get_errno()))", *REFUSED),
        ("System V semaphores", "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
         "print(libc.semget(0, 1, 0o1600), os.strerror(ctypes.get_errno()))", *REFUSED),
        ("POSIX message queue", f"{SYSCALL}sc({NR.get('mq_open')}, b'q', 0o102, 0o600, 0)", *REFUSED),
        ("POSIX shared memory", "from multiprocessing import shared_memory\n"
         "shared_memory.SharedMemory(create=True, size=1 << 20)", {"error"}, "Permission denied"),
        ("a memfd", "import os; os.memfd_create('x')", *DENIED),
        ("a kernel key", f"{SYSCALL}sc({NR.get('add_key')}, b'user', b'k', b'v', 1, -4)", *REFUSED),
        ("keyctl", f"{SYSCALL}sc({NR.get('keyctl')}, 0, -4, 0)", *REFUSED),
        ("userfaultfd", f"{SYSCALL}sc({NR.get('userfaultfd')}, 0)", *REFUSED),
        ("io_uring", f"{SYSCALL}sc({NR.get('io_uring_setup')}, 8, b'\\0' * 120)", *REFUSED),
        ("bpf", f"{SYSCALL}sc({NR.get('bpf')}, 0, b'\\0' * 128, 128)", *REFUSED),
        ("set the clock", "import time; time.clock_settime(time.CLOCK_REALTIME, time.time() + 3600)", *DENIED),
        ("set the hostname", "import socket; socket.sethostname('sandboxed')", *DENIED),
        ("read the kernel log", f"{SYSCALL}sc({NR.get('syslog')}, 10, 0, 0)", *REFUSED),
        ("/dev/kmsg", "open('/dev/kmsg')", {"error"}, "Permission denied"),
        ("tcp connect", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)", *DENIED),
        ("udp socket", "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)", *DENIED),
        ("an abstract unix socket", "import socket; socket.socket(socket.AF_UNIX).connect('\\0x')", *DENIED),
    ]
    if platform.machine() == "x86_64":
        kernel += [("I/O ports", f"{SYSCALL}sc({NR['iopl']}, 3)", *REFUSED),
                   ("the x32 ABI", f"{SYSCALL}sc(0x40000000 + 39)", *REFUSED)]
    return [(name, program, {statuses} if isinstance(statuses, str) else statuses, text)
            for name, program, statuses, text in own + files + processes + kernel]


def host_state(pids: list[int]) -> dict:
    """What a program must not change: each process's limits, priority, scheduling and CPUs; System V IPC objects;
    the hostname."""
    state: dict = {pid: (Path(f"/proc/{pid}/limits").read_text(), os.getpriority(os.PRIO_PROCESS, pid),
                         os.sched_getscheduler(pid), os.sched_getaffinity(pid)) for pid in pids}
    state["ipc"] = {p.name: p.read_text() for p in Path("/proc/sysvipc").glob("*")}
    state["hostname"] = socket.gethostname()
    return state


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


def run_battery(pool: SandboxPool, tmp_path: Path, victim: int, abi: int, timeouts: bool = True) -> None:
    """Runs the battery (without its programs that run into the time limits unless timeouts) on pool, checks each
    observation and then the host."""
    canary, checkpoint = tmp_path / "canary.txt", tmp_path / "checkpoints" / "0" / "params"
    canary.write_text("keep me")
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights")
    def files() -> dict:  # content, mode, times and extended attributes of each file there
        return {p: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode, p.stat().st_mtime_ns,
                    os.listxattr(p)) for p in tmp_path.rglob("*") if p.is_file()}

    before, library = files(), os.stat(os.__file__)
    project = tracked_files()
    watched = [victim, os.getpid(), *pool.workers.pids()]
    host = host_state(watched)
    clock = time.time() - time.monotonic()
    server = socket.create_server(("127.0.0.1", 0))  # a connection would be accepted if one got through
    server.settimeout(0.1)
    pids = [int(p.name) for p in Path("/proc").glob("[0-9]*")]
    cases = battery(canary, checkpoint, server.getsockname()[1], victim, pids, abi, pool.kernel["namespaces"] is None)
    cases = [c for c in cases if timeouts or "timeout" not in c[2]]
    assert len(cases) >= 60

    results = pool.run_many([[program] for _, program, _, _ in cases])

    for (name, _, statuses, text), result in zip(cases, results):
        seen = observation(result, CFG)
        texts = (text,) if isinstance(text, str) else text
        assert result.status in statuses and any(t in seen for t in texts), (name, result)
        assert len(seen) <= CFG.observation_chars + 200, name  # short, whatever the program printed
    assert "hunter2" not in "".join(r.output for r in results)
    with pytest.raises(TimeoutError):
        server.accept()
    assert files() == before  # nothing created, changed or deleted outside the sandbox
    assert os.stat(os.__file__) == library
    assert tracked_files() == project
    after = host_state(watched)  # every process's limits, priority and scheduling, IPC, the hostname
    assert after == host, {k: (host[k], after.get(k)) for k in host if after.get(k) != host[k]}
    assert abs(time.time() - time.monotonic() - clock) < 5.0  # the clock was not set
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 64  # the trainer's own limits, as they were
    # A worker cleans up and forks its next standby after it answers, so on a loaded machine the last programs' may
    # still be under way when run_many returns: give it until a deadline to settle.

    def folders_left() -> list[Path]:  # every program's folder removed: left, each worker's next standby's
        folders = list(Path(pool.root).iterdir())
        return folders if len(folders) == pool.workers.size and not any(any(f.iterdir()) for f in folders) else []

    def waiting() -> list[int]:  # no process left behind: each worker's standby and its program's process, waiting
        standbys = children_of(pool.workers.pids())
        programs = children_of(standbys)
        alone = len(standbys) == len(programs) == pool.workers.size and children_of(programs) == []
        return standbys if alone else []

    assert settled(folders_left), list(Path(pool.root).rglob("*"))
    assert settled(waiting), children_of(pool.workers.pids())
    assert pool.workers.restarts == 0  # no program could take its worker down
    assert said(pool.run(["print(6 * 7)"])) == ("ok", "42\n")


def test_each_hostile_program_gets_its_observation_and_leaves_the_host_as_it_was(pool, tmp_path, victim):
    run_battery(pool, tmp_path, victim, landlock_abi())


def test_a_negative_landlock_abi_is_named():
    with pytest.raises(ValueError, match="landlock_abi=-1"):
        SandboxConfig(landlock_abi=-1)


@pytest.mark.parametrize("abi", [1, 2, 3, 4, 5])
def test_the_battery_holds_where_landlock_is_older(abi, tmp_path, victim):
    """Each older kernel's path: Landlock forced down to ABI abi, seccomp denying what it no longer stops."""
    if landlock_abi() <= abi:
        pytest.skip(f"this kernel's Landlock ABI is {landlock_abi()}: the test above runs its path")
    with SandboxPool(dataclasses.replace(CFG, landlock_abi=abi), preload=()) as pool:
        run_battery(pool, tmp_path, victim, abi, timeouts=False)


def test_cells_see_the_earlier_cells_variables_and_only_the_last_cell_speaks(pool):
    cells = ["x = 5\nprint('not shown')", "y = undefined_name", "y = x * 2", "print(x + y)"]
    assert said(pool.run(cells)) == ("ok", "15\n")
    assert said(pool.run(["import sympy as sp", "print(sp.factorint(360))"])) == ("ok", "{2: 3, 3: 2, 5: 1}\n")
    assert pool.run(["z = 1", "print(z / 0)"]).output == "line 1: ZeroDivisionError: division by zero\n"


def said(result: Result) -> tuple[str, str]:
    return result.status, result.output


def test_a_replay_reproduces_what_its_cells_printed_on_every_worker(pool):
    """`random`, numpy's generator, the time module's clocks and a set's order: replayed on both workers (a parent
    and its forks), the earlier cell prints what it printed when it ran, so the last sees those values."""
    anchor = ("import random, time\nimport numpy as np\nx, y = random.random(), np.random.rand()\n"
              "t, n = time.time(), time.perf_counter_ns()\nprint(x, y, t, n, {'ab', 'cd', 'ef', 'gh', 'ij'})")
    ran = pool.run([anchor])
    assert ran.status == "ok" and len(ran.clock) == 2 and ran.diverged == -1
    again = "print(x, y, t, n, {'ab', 'cd', 'ef', 'gh', 'ij'})"
    results = pool.run_many([[anchor, again]] * 4, [[ran]] * 4)
    assert [said(r) for r in results] == [("ok", ran.output)] * 4 and all(r.diverged == -1 for r in results)
    # unchecked, the replay reads the real clock: what the earlier cell left is not what it printed
    assert pool.run([anchor, again]).output != ran.output


def test_a_replay_that_prints_otherwise_is_reported(pool):
    key = pool.run(["import os\nk = os.urandom(8).hex()\nprint(k)"])
    got = pool.run(["import os\nk = os.urandom(8).hex()\nprint(k)", "print(len(k))"], [key])
    assert said(got) == ("ok", "16\n") and got.diverged == 0
    assert observation(got, CFG).startswith("Note: re-run to restore this cell's variables, cell 1 printed otherwise")
    # a traceback is part of what a cell printed: a replay that raises where the cell did not has diverged
    ok = pool.run(["v = 1"])
    assert pool.run(["v = 1 / 0", "print(2)"], [ok]).diverged == 0
    raised = pool.run(["v = 1 / 0"])
    assert raised.status == "error" and pool.run(["v = 1 / 0", "print(2)"], [raised]).diverged == -1


def test_replayed_cells_are_not_charged_to_the_limits(pool):
    """Three cells each of about 0.4 s CPU and 0.75 s wall: the third program replays two of them, 1.2 s CPU and
    2.25 s in all, past its 1 s and 2 s limits, and still runs its cell under them."""
    n, start = 200_000, time.process_time()
    while time.process_time() - start < 0.1:
        n *= 2
        start = time.process_time()
        sum(i * i for i in range(n))
    seconds = time.process_time() - start
    cell = f"import time\nsum(i * i for i in range({int(n * 0.4 / seconds)}))\ntime.sleep(0.35)\nprint('done')"
    ran = []
    for k in range(1, 4):
        result = pool.run([cell] * k, ran)
        assert said(result) == ("ok", "done\n"), (k, result)
        ran.append(result)
    assert ran[-1].seconds > CFG.wall_s


def test_a_program_cannot_break_its_record(pool):
    """A program that writes junk on every descriptor it may hold (the record pipe among them) gets its answer,
    with an empty record: what it forges decides nothing but its own episode's replays."""
    junk = ("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'{\"clock\": [1e308, \"x\"], "
            "\"diverged\": 99}')\n    except OSError:\n        pass\nprint('wrote')")
    got = pool.run([junk])
    assert said(got) == ("ok", "wrote\n") and got.clock == () and got.diverged == -1
    # a record that parses but lacks its fields, sent by a program that ends before the real record is written
    lacking = "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'{}')\n    except OSError:\n" \
              "        pass\nos._exit(0)"
    restarts = pool.workers.restarts
    got = pool.run([lacking])
    assert got.status == "ok" and got.clock == () and pool.workers.restarts == restarts


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
    assert said(pool.run(["print('still serving')"])) == ("ok", "still serving\n")


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
