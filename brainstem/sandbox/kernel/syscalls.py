"""The syscall table: every syscall the seccomp policy names, by number on x86_64 and aarch64.

name: (x86_64 number, aarch64 number); None where the architecture has no
such call.  From the kernel's arch/x86/entry/syscalls/syscall_64.tbl and
include/uapi/asm-generic/unistd.h (aarch64); numbers from 424 up are the
same on every architecture.  tests/sandbox/kernel/test_seccomp.py checks this
table against the installed kernel headers and libseccomp.
"""

from __future__ import annotations

import platform

SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    # I/O on open fds
    "read": (0, 63), "write": (1, 64), "readv": (19, 65), "writev": (20, 66), "pread64": (17, 67),
    "recvfrom": (45, 207), "sendto": (44, 206), "recvmsg": (47, 212), "sendmsg": (46, 211),
    "close": (3, 57), "lseek": (8, 62), "fstat": (5, 80), "newfstatat": (262, 79), "statx": (332, 291),
    "getdents64": (217, 61), "fcntl": (72, 25), "ioctl": (16, 29),
    # memory
    "brk": (12, 214), "mmap": (9, 222), "munmap": (11, 215), "mprotect": (10, 226),
    "mremap": (25, 216), "madvise": (28, 233), "futex": (202, 98),
    # time
    "clock_gettime": (228, 113), "clock_getres": (229, 114), "gettimeofday": (96, 169),
    "time": (201, None), "nanosleep": (35, 101), "clock_nanosleep": (230, 115),
    # the process's own signal state, ids and limits
    "rt_sigaction": (13, 134), "rt_sigprocmask": (14, 135), "rt_sigreturn": (15, 139),
    "sigaltstack": (131, 132), "restart_syscall": (219, 128), "getpid": (39, 172),
    "gettid": (186, 178), "getppid": (110, 173), "getuid": (102, 174), "geteuid": (107, 175),
    "getgid": (104, 176), "getegid": (108, 177), "getgroups": (115, 158), "getresuid": (118, 148),
    "getresgid": (120, 150), "capget": (125, 90), "prlimit64": (302, 261), "prctl": (157, 167),
    "getrandom": (318, 278), "sched_yield": (24, 124), "set_robust_list": (273, 99),
    "rseq": (334, 293), "exit": (60, 93), "exit_group": (231, 94),
    # what the fork server needs besides
    "wait4": (61, 260), "setsid": (112, 157), "dup2": (33, None), "dup3": (292, 24),
    "close_range": (436, 436), "pipe2": (293, 59), "getsockname": (51, 204),
    "getsockopt": (55, 209), "select": (23, None), "pselect6": (270, 72),
    # sockets: the channel already exists
    "socket": (41, 198), "socketpair": (53, 199), "connect": (42, 203), "bind": (49, 200),
    "listen": (50, 201), "accept": (43, 202), "accept4": (288, 242),
    # running other programs
    "execve": (59, 221), "execveat": (322, 281),
    # reaching into other processes
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kcmp": (312, 272), "pidfd_open": (434, 434), "pidfd_getfd": (438, 438),
    "process_madvise": (440, 440), "process_mrelease": (448, 448),
    "migrate_pages": (256, 238), "move_pages": (279, 239), "setpriority": (141, 140),
    "sched_setaffinity": (203, 122), "sched_setscheduler": (144, 119), "sched_setparam": (142, 118),
    "sched_setattr": (314, 274), "ioprio_set": (251, 30),
    # signals
    "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240), "pidfd_send_signal": (424, 424),
    # namespaces and mounts
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "chroot": (161, 51), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "statmount": (457, 457), "listmount": (458, 458),
    "open_tree_attr": (467, 467),
    # kernel attack surface
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218), "bpf": (321, 280),
    "perf_event_open": (298, 241), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "userfaultfd": (323, 282), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "personality": (135, 92), "modify_ldt": (154, None),
    "iopl": (172, None), "ioperm": (173, None), "uselib": (134, None), "acct": (163, 89),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "syslog": (103, 116),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "clock_adjtime": (305, 266),
    "adjtimex": (159, 171), "sethostname": (170, 161), "setdomainname": (171, 162),
    "quotactl": (179, 60), "quotactl_fd": (443, 443), "vhangup": (153, 58),
    "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "fanotify_init": (300, 262), "fanotify_mark": (301, 263), "lookup_dcookie": (212, 18),
    "nfsservctl": (180, 42), "memfd_create": (319, 279), "memfd_secret": (447, 447),
    "seccomp": (317, 277), "lsm_set_self_attr": (460, 460), "fork": (57, None), "vfork": (58, None),
    # credentials
    "setuid": (105, 146), "setgid": (106, 144), "setreuid": (113, 145), "setregid": (114, 143),
    "setresuid": (117, 147), "setresgid": (119, 149), "setgroups": (116, 159),
    "setfsuid": (122, 151), "setfsgid": (123, 152), "capset": (126, 91),
    # SysV and POSIX IPC: shared with every process of the IPC namespace
    "shmget": (29, 194), "shmat": (30, 196), "shmdt": (67, 197), "shmctl": (31, 195),
    "semget": (64, 190), "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192),
    "msgget": (68, 186), "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187),
    "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182),
    "mq_timedreceive": (243, 183), "mq_notify": (244, 184), "mq_getsetattr": (245, 185),
    # changing the filesystem
    "creat": (85, None), "mknod": (133, None), "mknodat": (259, 33), "mkdir": (83, None),
    "mkdirat": (258, 34), "rmdir": (84, None), "unlink": (87, None), "unlinkat": (263, 35),
    "rename": (82, None), "renameat": (264, 38), "renameat2": (316, 276), "link": (86, None),
    "linkat": (265, 37), "symlink": (88, None), "symlinkat": (266, 36), "chmod": (90, None),
    "fchmod": (91, 52), "fchmodat": (268, 53), "fchmodat2": (452, 452), "chown": (92, None),
    "fchown": (93, 55), "lchown": (94, None), "fchownat": (260, 54), "truncate": (76, 45),
    "ftruncate": (77, 46), "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7),
    "removexattr": (197, 14), "lremovexattr": (198, 15), "fremovexattr": (199, 16),
    "setxattrat": (463, 463), "removexattrat": (466, 466), "file_setattr": (469, 469),
    "utime": (132, None), "utimes": (235, None), "futimesat": (261, None),
    "utimensat": (280, 88), "inotify_init": (253, None), "inotify_init1": (294, 26),
    "inotify_add_watch": (254, 27), "openat2": (437, 437),
    # allowed with a check of their arguments (clone3: ENOSYS, for libc to fall back to clone)
    "clone": (56, 220), "clone3": (435, 435), "open": (2, None), "openat": (257, 56),
    # used to build Landlock rulesets (before any filter)
    "landlock_create_ruleset": (444, 444), "landlock_restrict_self": (446, 446),
}

# No syscall has it (the table ends near 470): without a filter it gets ENOSYS.
UNKNOWN_SYSCALL = 1023

ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # table column, AUDIT_ARCH_*
X32_SYSCALL_BIT = 0x40000000  # set in the numbers of the x32 ABI's calls

MACHINE = platform.machine()
