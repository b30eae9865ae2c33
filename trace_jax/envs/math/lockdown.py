"""What a sandboxed program's process may do, set by the process on itself before it runs model-written code.

Four kernel mechanisms, each closing what the others leave open (Linux only; `sandbox_worker` calls `enclose` in
each program's freshly forked process, then `confine` once it has read its program):
- a private tmpfs of disk_mb mounted on the program's folder, in a mount namespace of its own (a user namespace
  too when not root), so its files live and die with it and cannot fill the host's disk; where the kernel refuses
  namespaces (`private_tmpfs` says why), the folder stays on disk and only each file's size is bounded;
- rlimits: CPU seconds, address space, file size, open files, no core dumps;
- Landlock (kernel >= 5.13): reads only below the Python installation's library folders, reads and writes only
  below the program's private folder; no TCP (ABI >= 4); no signals to, nor abstract sockets of, processes outside
  the sandbox (ABI >= 6);
- seccomp: no new processes (fork, vfork, clone but of threads, clone3), no exec, no sockets, no ptrace, no kill
  (tgkill of its own threads only), no namespaces, mounts, keys, BPF or modules.

A process that cannot lock itself down raises `LockdownError` and runs nothing: the boundary fails closed.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import resource
import struct
import sys
import sysconfig

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_PDEATHSIG, SECCOMP_MODE_FILTER = 38, 22, 1, 2
CLONE_NEWNS, CLONE_NEWUSER, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x20000, 0x10000000, 2, 4, 1 << 14, 1 << 18
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # the same on both arches
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_ACCESS_BITS = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}  # ABI -> how many filesystem rights it knows (bits 0..n-1)
FS_EXECUTE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 2, 1 << 3
NET_TCP = 0b11  # bind and connect (ABI >= 4)
SCOPE_ALL = 0b11  # abstract unix sockets and signals (ABI >= 6)

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
CLONE_THREAD = 0x10000
_DENIED = {  # syscalls a program never needs: fail with EPERM
    "x86_64": dict(fork=57, vfork=58, execve=59, execveat=322, socket=41, socketpair=53, ptrace=101, kill=62,
                   tkill=200, unshare=272, setns=308, mount=165, umount2=166, pivot_root=155, chroot=161,
                   process_vm_readv=310, process_vm_writev=311, bpf=321, perf_event_open=298, userfaultfd=323,
                   io_uring_setup=425, keyctl=250, add_key=248, request_key=249, init_module=175,
                   finit_module=313, delete_module=176, reboot=169, kexec_load=246, swapon=167, swapoff=168),
    "aarch64": dict(execve=221, execveat=281, socket=198, socketpair=199, ptrace=117, kill=129, tkill=130,
                    unshare=97, setns=268, mount=40, umount2=39, pivot_root=41, chroot=51, process_vm_readv=270,
                    process_vm_writev=271, bpf=280, perf_event_open=241, userfaultfd=282, io_uring_setup=425,
                    keyctl=219, add_key=217, request_key=218, init_module=105, finit_module=273,
                    delete_module=106, reboot=142, kexec_load=104, swapon=224, swapoff=225),
}
_CLONE = {"x86_64": 56, "aarch64": 220}
_CLONE3, _TGKILL = 435, {"x86_64": 234, "aarch64": 131}


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


def private_tmpfs(folder: str, disk_mb: int) -> str | None:
    """Mounts a tmpfs of disk_mb on folder, seen by this process alone; None, or why it could not."""
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWNS | (0 if uid == 0 else CLONE_NEWUSER)) < 0:
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
                   f"size={disk_mb}m,mode=700".encode()) < 0:
        return f"mount tmpfs: {os.strerror(ctypes.get_errno())}"
    return None


def mapped_bytes() -> int:
    """The process's address space now (before Landlock, which closes /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def set_limits(mapped: int, cpu_s: int, memory_mb: int, file_mb: int, open_files: int = 64) -> None:
    """CPU seconds (SIGXCPU, then SIGKILL a second later), address space beyond `mapped` (the process's own),
    bytes per written file, open descriptors; no core files."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (memory_mb << 20),) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _check(result: int, what: str) -> int:
    if result < 0:
        raise LockdownError(f"{what} failed: {os.strerror(ctypes.get_errno())}")
    return result


def restrict_files(writable: str, readable: list[str]) -> None:
    """Landlock: every filesystem right below `writable`; read, list and execute below each of `readable`; nothing
    elsewhere. Also no TCP and no signals or abstract sockets outside, where the kernel's ABI has them."""
    abi = landlock_abi()
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


def _seccomp_program(arch: str, pid: int) -> list[tuple[int, int, int, int]]:
    """The BPF filter as (code, jt, jf, k) instructions: the syscalls above fail, the rest are allowed."""
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, AUDIT_ARCH[arch]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if arch == "x86_64":  # the x32 ABI's numbers: refused
        prog += [(0x35, 0, 1, 0x40000000), (ret, 0, 0, eperm)]  # BPF_JMP|JGE|K
    for nr in _DENIED[arch].values():
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, _CLONE3), (ret, 0, 0, enosys)]  # glibc then falls back to clone for threads
    prog += [(jeq, 0, 4, _CLONE[arch]), (ld, 0, 0, 16), (jset, 0, 1, CLONE_THREAD), (ret, 0, 0, allow),
             (ret, 0, 0, eperm)]  # clone: threads only
    prog += [(jeq, 0, 4, _TGKILL[arch]), (ld, 0, 0, 16), (jeq, 0, 1, pid), (ret, 0, 0, allow),
             (ret, 0, 0, eperm)]  # tgkill: its own threads only
    return [*prog, (ret, 0, 0, allow)]


def restrict_syscalls() -> None:
    """seccomp: installs `_seccomp_program` on this process (and the threads it starts later)."""
    arch = platform.machine()
    if sys.platform != "linux" or arch not in AUDIT_ARCH:
        raise LockdownError(f"the sandbox's syscall filter is written for Linux on {sorted(AUDIT_ARCH)}, not "
                            f"{sys.platform} on {arch}")
    prog = _seccomp_program(arch, os.getpid())
    filters = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog), 8 * len(prog))
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxP", len(prog), ctypes.addressof(filters)), 16)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "prctl(SECCOMP)")


def enclose(folder: str, disk_mb: int) -> int:
    """What a process can do before it knows its program: die with the worker that forked it, its folder a private
    tmpfs (where the kernel allows: `probe` says), Landlock. Its address space before any program (`set_limits`)."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl(PDEATHSIG)")
    private_tmpfs(folder, disk_mb)
    mapped = mapped_bytes()
    restrict_files(folder, readable_roots())
    return mapped


def confine(mapped: int, cpu_s: int, memory_mb: int, file_mb: int) -> None:
    """The rest, once the program's limits are known; the calling process then runs the program."""
    set_limits(mapped, cpu_s, memory_mb, file_mb)
    restrict_syscalls()


def probe() -> dict:
    """What this machine's kernel lets the sandbox do: {"landlock_abi", "tmpfs": None or why not}. Run in a process
    of its own (`python -m trace_jax.envs.math.lockdown`): it enters namespaces."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="trace-jax-probe-")
    try:
        return {"landlock_abi": landlock_abi(), "tmpfs": private_tmpfs(folder, 1)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    import json

    print(json.dumps(probe()))
