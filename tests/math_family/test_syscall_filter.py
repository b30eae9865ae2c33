"""The sandbox's seccomp filter: its syscall numbers against the kernel's headers, and what it decides for each
call, by a plain interpreter of its BPF (so both arches are checked, whichever this machine is)."""

import re
from pathlib import Path

import pytest

from trace_jax.envs.math import syscall_filter as sf

HEADERS = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
           "aarch64": Path("/usr/include/asm-generic/unistd.h")}
PID = 4321


@pytest.mark.parametrize("arch", sorted(sf.NUMBERS))
def test_the_numbers_are_the_kernels(arch):
    if not HEADERS[arch].exists():
        pytest.skip(f"no {HEADERS[arch]} on this machine (linux-libc-dev)")
    defined = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", HEADERS[arch].read_text())}
    known = {name: n for name, n in sf.NUMBERS[arch].items() if name in defined}
    assert known == {name: defined[name] for name in known}
    newer = {name: n for name, n in sf.NUMBERS[arch].items() if name not in defined}
    assert all(n >= 424 for n in newer.values()), newer  # newer than these headers: the table both arches share


def decide(prog: list[sf.Instruction], arch: str, nr: int, args: tuple[int, ...] = (), audit: int = 0) -> int:
    """What the kernel's classic BPF would return for this call (the subset of opcodes the filter uses); audit:
    the caller's ABI (0: arch's own)."""
    data = {0: nr, 4: audit or sf.AUDIT_ARCH[arch], **{16 + 8 * i: a & 0xFFFFFFFF for i, a in enumerate(args)}}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:
            acc = data.get(k, 0)
        elif code == 0x06:
            return k
        elif code in (0x15, 0x35):
            pc += jt if (acc == k if code == 0x15 else acc >= k) else jf
        else:
            raise AssertionError(f"opcode {code:#x}")
        pc += 1


@pytest.mark.parametrize("arch", sorted(sf.NUMBERS))
def test_the_filter_decides_each_class(arch):
    prog, nr = sf.program(arch, PID), sf.NUMBERS[arch]
    for name in sf.DENIED:
        if name in nr:
            assert decide(prog, arch, nr[name], (0, 0)) == sf.EPERM, name
    for name in sf.SELF_ONLY:
        assert decide(prog, arch, nr[name], (PID, PID, 15)) == sf.ALLOW, name
        assert decide(prog, arch, nr[name], (PID + 1, PID + 1, 15)) == sf.EPERM, name
        assert decide(prog, arch, nr[name], (0, 0, 15)) == sf.EPERM, name
    for name in sf.SELF_OR_ZERO:
        for pid, want in ((0, sf.ALLOW), (PID, sf.ALLOW), (1, sf.EPERM), (PID + 1, sf.EPERM)):
            assert decide(prog, arch, nr[name], (pid, 7)) == want, (name, pid)
    for name in sf.PRIORITY:
        for which, who, want in ((0, 0, sf.ALLOW), (0, PID, sf.ALLOW), (0, 1, sf.EPERM), (1, 0, sf.EPERM),
                                 (2, 0, sf.EPERM), (2, PID, sf.EPERM)):
            assert decide(prog, arch, nr[name], (which, who, 19)) == want, (name, which, who)
    for cmd in sf.FCNTL_DENIED:
        assert decide(prog, arch, nr["fcntl"], (3, cmd, PID + 1)) == sf.EPERM
    for cmd in (1, 2, 3, 4, 1030):  # F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC
        assert decide(prog, arch, nr["fcntl"], (3, cmd, 0)) == sf.ALLOW
    for cmd in sf.IOCTL_DENIED:
        assert decide(prog, arch, nr["ioctl"], (0, cmd, 0)) == sf.EPERM
    assert decide(prog, arch, nr["ioctl"], (0, 0x5401, 0)) == sf.ALLOW  # TCGETS: isatty
    others = {"x86_64": (0, 1, 9, 231), "aarch64": (63, 64, 222, 94)}[arch]  # read, write, mmap, exit_group
    assert [decide(prog, arch, n) for n in others] == [sf.ALLOW] * 4
    assert decide(prog, arch, others[0], audit=0x40000003) == sf.KILL  # a 32-bit x86 call
    if arch == "x86_64":
        assert decide(prog, arch, 0x40000000 + 39) == sf.EPERM  # x32's getpid
