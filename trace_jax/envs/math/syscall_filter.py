"""The sandboxed program's seccomp filter: which system calls it may make, and with which arguments.

The filter does not depend on the kernel's Landlock ABI: it denies on every kernel what Landlock's newer ABIs also
stop (signals to other processes, abstract sockets, TCP, `truncate` of files outside), so that a kernel with an
older Landlock is as closed as a new one. What it denies, by class:
- processes, threads and programs: fork, vfork, clone (threads too: each is a pid and kernel memory outside the
  address-space limit), clone3, exec;
- any effect on, or sight of, another process: kill and tkill; tgkill, rt_sigqueueinfo and rt_tgsigqueueinfo but to
  itself; pidfds; ptrace, process_vm_*, kcmp; prlimit64, sched_*affinity / sched_get*, getpgid, getsid,
  get_robust_list but of itself (pid 0 or its own); getpriority / setpriority but PRIO_PROCESS of itself; scheduling
  policies, I/O priorities, page migration, perf events; setsid and setpgid (it stays in the group the worker kills);
  signal-on-I/O owners (fcntl F_SETOWN, F_SETOWN_EX, F_SETSIG; ioctl FIOSETOWN, SIOCSPGRP, TIOCSPGRP, TIOCSTI);
  leases and flock (a host writer would wait on a library file it holds); inotify (it would see host folders);
- the metadata of files it may read (Landlock checks none of these): chmod, chown, utimes, extended attributes and
  ACLs, inode flags (FS_IOC_SETFLAGS, FS_IOC_FSSETXATTR); the host's mount table (statmount, listmount);
- kernel objects that outlive it: System V shared memory, semaphores and message queues, POSIX message queues, keys,
  BPF, io_uring, userfaultfd, memfds (pages outside the address-space limit), fanotify;
- the host: sockets, namespaces and every mount call (old and new API), chroot, modules, reboot, kexec, swap, the
  clock, hostname and domain name, I/O ports, the kernel log, accounting, quotas, file handles, credentials and
  capabilities, personality, `truncate` by path.
Everything else is allowed. A call from another ABI (x32, or 32-bit x86) kills the process.
"""

from __future__ import annotations

import errno

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

_X86_64 = dict(
    fork=57, vfork=58, clone=56, clone3=435, execve=59, execveat=322, kill=62, tkill=200, tgkill=234,
    rt_sigqueueinfo=129, rt_tgsigqueueinfo=297, pidfd_open=434, pidfd_send_signal=424, pidfd_getfd=438,
    process_madvise=440, process_mrelease=448, ptrace=101, process_vm_readv=310, process_vm_writev=311, kcmp=312,
    prlimit64=302, sched_setaffinity=203, sched_getaffinity=204, sched_getscheduler=145, sched_getparam=143,
    sched_getattr=315, sched_rr_get_interval=148, getpgid=121, getsid=124, get_robust_list=274, getpriority=140,
    setpriority=141, sched_setscheduler=144, sched_setparam=142, sched_setattr=314, ioprio_set=251, ioprio_get=252,
    migrate_pages=256, move_pages=279, perf_event_open=298, setsid=112, setpgid=109, fcntl=72, ioctl=16,
    shmget=29, shmat=30, shmctl=31, shmdt=67, semget=64, semop=65, semctl=66, semtimedop=220, msgget=68, msgsnd=69,
    msgrcv=70, msgctl=71, mq_open=240, mq_unlink=241, mq_timedsend=242, mq_timedreceive=243, mq_notify=244,
    mq_getsetattr=245, keyctl=250, add_key=248, request_key=249, bpf=321, io_uring_setup=425, io_uring_enter=426,
    io_uring_register=427, userfaultfd=323, memfd_create=319, memfd_secret=447, fanotify_init=300,
    socket=41, socketpair=53, unshare=272, setns=308, mount=165, umount2=166, pivot_root=155, chroot=161,
    open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442,
    init_module=175, finit_module=313, delete_module=176, reboot=169, kexec_load=246, kexec_file_load=320,
    swapon=167, swapoff=168, settimeofday=164, clock_settime=227, clock_adjtime=305, adjtimex=159,
    sethostname=170, setdomainname=171, iopl=172, ioperm=173, syslog=103, acct=163, quotactl=179, quotactl_fd=443,
    vhangup=153, open_by_handle_at=304, name_to_handle_at=303, setuid=105, setgid=106, setreuid=113, setregid=114,
    setresuid=117, setresgid=119, setfsuid=122, setfsgid=123, setgroups=116, capget=125, capset=126,
    personality=135, uselib=134, lookup_dcookie=212, truncate=76,
    chmod=90, fchmod=91, fchmodat=268, fchmodat2=452, chown=92, fchown=93, lchown=94, fchownat=260, utime=132,
    utimes=235, futimesat=261, utimensat=280, setxattr=188, lsetxattr=189, fsetxattr=190, removexattr=197,
    lremovexattr=198, fremovexattr=199, setxattrat=463, removexattrat=466, file_setattr=469, inotify_init=253,
    inotify_init1=294, inotify_add_watch=254, statmount=457, listmount=458, flock=73,
)
_AARCH64 = dict(  # asm-generic numbers; aarch64 has no fork, vfork, iopl, ioperm, uselib, nor the non-*at file calls
    clone=220, clone3=435, execve=221, execveat=281, kill=129, tkill=130, tgkill=131, rt_sigqueueinfo=138,
    rt_tgsigqueueinfo=240, pidfd_open=434, pidfd_send_signal=424, pidfd_getfd=438, process_madvise=440,
    process_mrelease=448, ptrace=117, process_vm_readv=270, process_vm_writev=271, kcmp=272, prlimit64=261,
    sched_setaffinity=122, sched_getaffinity=123, sched_getscheduler=120, sched_getparam=121, sched_getattr=275,
    sched_rr_get_interval=127, getpgid=155, getsid=156, get_robust_list=100, getpriority=141, setpriority=140,
    sched_setscheduler=119, sched_setparam=118, sched_setattr=274, ioprio_set=30, ioprio_get=31, migrate_pages=238,
    move_pages=239, perf_event_open=241, setsid=157, setpgid=154, fcntl=25, ioctl=29,
    shmget=194, shmat=196, shmctl=195, shmdt=197, semget=190, semop=193, semctl=191, semtimedop=192, msgget=186,
    msgsnd=189, msgrcv=188, msgctl=187, mq_open=180, mq_unlink=181, mq_timedsend=182, mq_timedreceive=183,
    mq_notify=184, mq_getsetattr=185, keyctl=219, add_key=217, request_key=218, bpf=280, io_uring_setup=425,
    io_uring_enter=426, io_uring_register=427, userfaultfd=282, memfd_create=279, memfd_secret=447,
    fanotify_init=262, socket=198, socketpair=199, unshare=97, setns=268, mount=40, umount2=39, pivot_root=41,
    chroot=51, open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442,
    init_module=105, finit_module=273, delete_module=106, reboot=142, kexec_load=104, kexec_file_load=294,
    swapon=224, swapoff=225, settimeofday=170, clock_settime=112, clock_adjtime=266, adjtimex=171,
    sethostname=161, setdomainname=162, syslog=116, acct=89, quotactl=60, quotactl_fd=443, vhangup=58,
    open_by_handle_at=265, name_to_handle_at=264, setuid=146, setgid=144, setreuid=145, setregid=143,
    setresuid=147, setresgid=149, setfsuid=151, setfsgid=152, setgroups=159, capget=90, capset=91,
    personality=92, lookup_dcookie=18, truncate=45,
    fchmod=52, fchmodat=53, fchmodat2=452, fchown=55, fchownat=54, utimensat=88, setxattr=5, lsetxattr=6,
    fsetxattr=7, removexattr=14, lremovexattr=15, fremovexattr=16, setxattrat=463, removexattrat=466,
    file_setattr=469, inotify_init1=26, inotify_add_watch=27, statmount=457, listmount=458, flock=32,
)
NUMBERS = {"x86_64": _X86_64, "aarch64": _AARCH64}  # checked against the kernel headers in the tests

SELF_ONLY = ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # first argument: its own pid
SELF_OR_ZERO = ("prlimit64", "sched_setaffinity", "sched_getaffinity", "sched_getscheduler", "sched_getparam",
                "sched_getattr", "sched_rr_get_interval", "getpgid", "getsid", "get_robust_list")  # pid 0: itself
PRIORITY = ("getpriority", "setpriority")  # (which, who): PRIO_PROCESS (0) of pid 0 or its own
F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETLEASE = 8, 10, 15, 1024
FCNTL_DENIED = (F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETLEASE)
IOCTL_DENIED = (0x8901, 0x8902, 0x5410, 0x5412,  # FIOSETOWN, SIOCSPGRP, TIOCSPGRP, TIOCSTI
                0x40086602, 0x401C5820)  # FS_IOC_SETFLAGS, FS_IOC_FSSETXATTR
DENIED = tuple(n for n in _X86_64 if n not in (*SELF_ONLY, *SELF_OR_ZERO, *PRIORITY, "fcntl", "ioctl"))

_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
ALLOW, KILL, EPERM = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM
Instruction = tuple[int, int, int, int]  # (code, jt, jf, k), as struct sock_filter


def _arg(i: int) -> Instruction:
    """Loads the low 32 bits of argument i (pids, commands and flags are ints; both arches are little-endian)."""
    return (_LD, 0, 0, 16 + 8 * i)


def _arg_in(i: int, values: tuple[int, ...], then: int, otherwise: int) -> list[Instruction]:
    """Returns `then` if argument i is one of values, else `otherwise`."""
    n = len(values)
    return [_arg(i), *((_JEQ, n - j, 0, v) for j, v in enumerate(values)), (_RET, 0, 0, otherwise),
            (_RET, 0, 0, then)]


def _on(nr: int, body: list[Instruction]) -> list[Instruction]:
    """body (which always returns) for syscall nr; the next check for any other."""
    return [(_JEQ, 0, len(body), nr), *body]


def program(arch: str, pid: int) -> list[Instruction]:
    """The filter for the process `pid` (the one that installs it) on arch."""
    nr = NUMBERS[arch]
    prog = [(_LD, 0, 0, 4), (_JEQ, 1, 0, AUDIT_ARCH[arch]), (_RET, 0, 0, KILL), (_LD, 0, 0, 0)]
    if arch == "x86_64":  # the x32 ABI's numbers: refused
        prog += [(_JGE, 0, 1, 0x40000000), (_RET, 0, 0, EPERM)]
    for name in DENIED:
        if name in nr:
            prog += [(_JEQ, 0, 1, nr[name]), (_RET, 0, 0, EPERM)]
    for name in SELF_ONLY:
        prog += _on(nr[name], _arg_in(0, (pid,), ALLOW, EPERM))
    for name in SELF_OR_ZERO:
        prog += _on(nr[name], _arg_in(0, (0, pid), ALLOW, EPERM))
    for name in PRIORITY:
        who = _arg_in(1, (0, pid), ALLOW, EPERM)
        prog += _on(nr[name], [_arg(0), (_JEQ, 0, len(who), 0), *who, (_RET, 0, 0, EPERM)])
    prog += _on(nr["fcntl"], _arg_in(1, FCNTL_DENIED, EPERM, ALLOW))
    prog += _on(nr["ioctl"], _arg_in(1, IOCTL_DENIED, EPERM, ALLOW))
    return [*prog, (_RET, 0, 0, ALLOW)]
