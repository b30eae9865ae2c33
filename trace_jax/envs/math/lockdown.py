"""What a sandboxed program's process may do, set by the processes on themselves before model-written code runs.

Six kernel mechanisms, each closing what the others leave open (Linux only). `sandbox_worker` calls `enclose` in
each standby it forks (the program's parent, which never runs model code), then `confine` in the program's own
process, forked from the standby, once it has read its program:
- namespaces: a mount namespace with a private tmpfs of disk_mb on the program's folder, so its files live and die
  with it and cannot fill the host's disk, and an empty one over /proc, and an IPC namespace, so no System V object
  outlives it (a user namespace too when not root); where the kernel refuses namespaces (`private_namespaces` says
  why), the folder stays on disk and only each file's size is bounded;
- capabilities: none, root included (bounding set dropped where it may be, then effective, permitted, inheritable
  and ambient sets cleared, and checked empty), with no_new_privs;
- the standby not dumpable, so that the program cannot reach its descriptors through /proc;
- rlimits: CPU seconds, address space, file size, open files, no core dumps, no real-time or raised priority, 16
  pending signals;
- Landlock (kernel >= 5.13): reads only below the Python installation's library folders, reads and writes only
  below the program's private folder (truncate from ABI 3); no TCP (ABI >= 4); no signals to, nor abstract
  sockets of, processes outside the sandbox (ABI >= 6);
- seccomp (`syscall_filter`): the same on every kernel, so it also denies what an older Landlock ABI leaves open.

A process that cannot lock itself down raises `LockdownError` and runs nothing: the boundary fails closed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import resource
import struct
import sys
import sysconfig

from trace_jax.envs.math import syscall_filter

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_PDEATHSIG, SECCOMP_MODE_FILTER = 38, 22, 1, 2
PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE = 36, 4
MNT_DETACH, MS_RDONLY, MS_NOEXEC = 2, 1, 8
FOLDER_INODES = 8192  # files and folders a program may create (each costs kernel memory no other limit counts)
PR_CAPBSET_READ, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 23, 24, 47, 4
CAPABILITY_VERSION_3 = 0x20080522
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x20000, 0x08000000, 0x10000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 1 << 14, 1 << 18
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # the same on both arches
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_ACCESS_BITS = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}  # ABI -> how many filesystem rights it knows (bits 0..n-1)
FS_EXECUTE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 2, 1 << 3
NET_TCP = 0b11  # bind and connect (ABI >= 4)
SCOPE_ALL = 0b11  # abstract unix sockets and signals (ABI >= 6)


class LockdownError(RuntimeError):
    """The kernel refused a restriction: the program must not run."""


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: no Landlock)."""
    if sys.platform != "linux":
        return 0
    version = _libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                            ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(version), 0)


@functools.cache
def readable_roots() -> list[str]:
    """The folders a program may read: the Python installation's stdlib and site-packages (a venv's and its base's),
    not the project that may sit beside them."""
    paths = set()
    for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        got = sysconfig.get_paths(vars=scheme_vars or None)
        paths |= {got[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return sorted(p for p in paths if os.path.isdir(p))


def private_namespaces(folder: str, disk_mb: int) -> str | None:
    """This process in mount and IPC namespaces of its own, a tmpfs of disk_mb on folder; None, or why it could not
    (then no namespace may have been entered)."""
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | (0 if uid == 0 else CLONE_NEWUSER)) < 0:
        return f"unshare: {os.strerror(ctypes.get_errno())}"
    try:
        if uid != 0:  # map this user to root of the new namespace, which may then mount
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
    except OSError as e:
        return f"user namespace maps: {e}"
    if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) < 0:
        return f"mount --make-rprivate /: {os.strerror(ctypes.get_errno())}"
    if _libc.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                   f"size={disk_mb}m,nr_inodes={FOLDER_INODES},mode=700".encode()) < 0:
        return f"mount tmpfs: {os.strerror(ctypes.get_errno())}"
    return None


def hide_proc() -> None:
    """An empty, read-only tmpfs over /proc in this mount namespace: no host pid can even be stat'ed (Landlock
    checks no stat). Only after `private_namespaces` succeeded; before Landlock."""
    _check(_libc.mount(b"none", b"/proc", b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       b"size=4k,nr_inodes=1,mode=555"), "mount tmpfs on /proc")


def capability_sets() -> tuple[int, int, int]:
    """This process's (effective, permitted, inheritable) capability masks."""
    header = ctypes.create_string_buffer(struct.pack("Ii", CAPABILITY_VERSION_3, 0), 8)
    data = ctypes.create_string_buffer(24)
    _check(_libc.capget(header, data), "capget")
    words = struct.unpack("6I", data.raw)
    return tuple(words[i] | words[i + 3] << 32 for i in range(3))


def drop_capabilities() -> None:
    """No capability left, root's included: the bounding set dropped (where this process may: it needs
    CAP_SETPCAP), the ambient set cleared, then the effective, permitted and inheritable sets emptied and checked."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0:  # EINVAL past the kernel's last capability
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: nothing to drop then
        cap += 1
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(CAP_AMBIENT_CLEAR_ALL)")
    header = ctypes.create_string_buffer(struct.pack("Ii", CAPABILITY_VERSION_3, 0), 8)
    _check(_libc.capset(header, ctypes.create_string_buffer(24)), "capset")
    if capability_sets() != (0, 0, 0):
        raise LockdownError(f"capabilities left after capset: {capability_sets()}")


def mapped_bytes() -> int:
    """The process's address space now (before Landlock, which closes /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def set_limits(mapped: int, cpu_s: int, memory_mb: int, file_mb: int, open_files: int = 64) -> None:
    """CPU seconds (SIGXCPU, then SIGKILL a second later), address space beyond `mapped` (the process's own),
    bytes per written file, open descriptors; no core files, no real-time priority, no raised nice value. Without
    capabilities, the program cannot raise them again."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (memory_mb << 20),) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files,) * 2)
    for limit in (resource.RLIMIT_CORE, resource.RLIMIT_RTPRIO, resource.RLIMIT_NICE):
        resource.setrlimit(limit, (0, 0))
    # Queued signals and POSIX timers count against the user's total (every process of root's, for root): a
    # program may add to it only while that total is below 16.
    resource.setrlimit(resource.RLIMIT_SIGPENDING, (16, 16))


def _check(result: int, what: str) -> int:
    if result < 0:
        raise LockdownError(f"{what} failed: {os.strerror(ctypes.get_errno())}")
    return result


def restrict_files(writable: str, readable: list[str], max_abi: int = 0) -> None:
    """Landlock: every filesystem right below `writable`; read, list and execute below each of `readable`; nothing
    elsewhere. Also no TCP and no signals or abstract sockets outside, where the kernel's ABI has them. max_abi > 0
    uses no newer ABI than that (an older kernel's path, for tests)."""
    abi = min(landlock_abi(), max_abi or 1 << 30)
    if abi < 1:
        raise LockdownError("Landlock is not available in this kernel (Linux >= 5.13 with landlock in its LSM list "
                            "is needed to confine sandboxed programs to their folder)")
    fs_all = (1 << FS_ACCESS_BITS.get(abi, 16)) - 1
    attr = struct.pack("QQQ", fs_all, NET_TCP if abi >= 4 else 0, SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    buf = ctypes.create_string_buffer(attr[:size], size)
    ruleset = _check(_libc.syscall(LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(size), ctypes.c_uint32(0)),
                     "landlock_create_ruleset")
    try:
        for path, access in [(writable, fs_all), *((p, FS_EXECUTE | FS_READ_FILE | FS_READ_DIR) for p in readable)]:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
                _check(_libc.syscall(LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                                     rule, ctypes.c_uint32(0)), f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        _check(_libc.syscall(LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)


def restrict_syscalls() -> None:
    """seccomp: installs `syscall_filter.program` on this process."""
    arch = platform.machine()
    if sys.platform != "linux" or arch not in syscall_filter.AUDIT_ARCH:
        raise LockdownError(f"the sandbox's syscall filter is written for Linux on "
                            f"{sorted(syscall_filter.AUDIT_ARCH)}, not {sys.platform} on {arch}")
    prog = syscall_filter.program(arch, os.getpid())
    filters = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog), 8 * len(prog))
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxP", len(prog), ctypes.addressof(filters)), 16)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "prctl(SECCOMP)")


def become_subreaper() -> None:
    """Orphaned descendants of this process are reparented to it (so that it can reap them), not to init."""
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")


def enclose(folder: str, disk_mb: int, max_abi: int = 0) -> int:
    """What the standby does before it forks the program's process: die with the worker that forked it, its own
    namespaces with a private tmpfs on its folder and /proc hidden (where the kernel allows: `probe` says), not
    dumpable (its /proc entries closed to the program, which inherits this), no capabilities, Landlock. Its
    address space before any program (`set_limits`)."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl(PDEATHSIG)")
    private = private_namespaces(folder, disk_mb) is None
    mapped = mapped_bytes()
    if private:
        hide_proc()
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")  # after the user namespace's maps
    drop_capabilities()
    restrict_files(folder, readable_roots(), max_abi)
    return mapped


def confine(parent: int, mapped: int, cpu_s: int, memory_mb: int, file_mb: int) -> None:
    """The program's own process, once its limits are known: dies with its standby `parent`, its limits, seccomp;
    it then runs the program."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl(PDEATHSIG)")
    if os.getppid() != parent:
        raise LockdownError("the standby that forked this program ended before it could be confined")
    set_limits(mapped, cpu_s, memory_mb, file_mb)
    restrict_syscalls()


def probe() -> dict:
    """What this machine's kernel lets the sandbox do: {"landlock_abi", "namespaces": None or why not}. Run in a
    process of its own (`python -m trace_jax.envs.math.lockdown`): it enters namespaces."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="trace-jax-probe-")
    try:
        return {"landlock_abi": landlock_abi(), "namespaces": private_namespaces(folder, 1)}
    finally:
        _libc.umount2(folder.encode(), MNT_DETACH)  # the tmpfs covers the folder: removed from below it
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    import json

    print(json.dumps(probe()))
