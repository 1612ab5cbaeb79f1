"""Kernel-level isolation of sandbox workers: the walls behind the interpreter.

RestrictedPython is the first wall: it decides what tool code can *name*.
This package is for the day it fails.  Whatever tool code reaches inside the
interpreter, the worker process it runs in can do next to nothing with the
kernel:

* **network namespace** -- the fork server unshares ``CLONE_NEWNET`` once at
  start, so it and every worker live in a namespace with no interface up (not
  even loopback).  A worker talks to the world only through its channel, an
  AF_UNIX socketpair made before the fork (socketpairs are not bound to a
  namespace).  ``ctx.fetch`` is done by the runtime, outside.  Once per fork
  server rather than once per worker: a per-worker namespace costs 0.3-2 ms
  per call here and buys nothing more, since workers cannot make sockets.
* **user namespace** (runtime not root, or root that cannot make a child
  uid 65534: ``unshare -r`` and rootless containers map uid 0 only) -- the
  fork server unshares ``CLONE_NEWUSER | CLONE_NEWNET`` and maps uid/gid
  65534 inside to the runtime's uid/gid outside; that is what lets an
  unprivileged runtime have a network namespace.  To the kernel the workers
  still own the runtime's files and processes: Landlock and seccomp keep them
  away from those.  Whether a root runtime can switch is tried once, in a
  throwaway child; if not, the uid drop is off and the report says why.
* **capabilities** -- as root the fork server keeps only CAP_SETUID,
  CAP_SETGID (to turn workers into nobody) and CAP_KILL (to kill them on
  timeout), in its effective, permitted and bounding sets; otherwise it
  keeps none.  Workers hold none.
* **filesystem** -- Landlock (when the kernel has it): a ruleset handling
  every filesystem access right the kernel knows, with no rule, so nothing is
  readable, writable or executable; TCP bind/connect (ABI >= 4), signals and
  abstract unix sockets (ABI >= 6) are scoped the same way.  Applied once, to
  the fork server before its first fork: every worker inherits the domain.
  (A domain per worker would also scope signals between workers; seccomp
  already denies them, and a domain per worker cost 0.1-0.4 ms per call.)
  Without Landlock, and when root or in a user namespace, the fork server
  chroots into an empty, deleted directory instead.  Either way every module
  a tool may need, codecs included, is imported first.
* **seccomp** -- an allowlist, as BPF built here from an explicit syscall
  table for x86_64 and aarch64 (see ``seccomp.WORKER_ALLOW``): a worker may touch
  its own memory, clocks, signal handlers, ids and limits, and do I/O on the
  fds it holds; every other syscall (sockets, exec, fork, signals, ptrace,
  other processes' limits, priority and CPUs, namespaces, mounts, keys, bpf,
  io_uring, IPC, file changes, credentials, a syscall newer than the table)
  fails with EPERM, and opening for writing with EACCES, so Python raises
  PermissionError and the tool fails cleanly; a foreign architecture or the
  x32 ABI kills the process.  Installed in two parts because attaching a
  filter costs in proportion to its length: the fork server installs the
  bulk once for itself (the workers' list plus what it needs to fork, reap,
  kill and make nobody of them: ``SERVER_ONLY``), and each worker, after
  ``PR_SET_NO_NEW_PRIVS`` and just before tool code runs, adds a short
  filter taking ``SERVER_ONLY`` away again.

Nothing here may make the sandbox unusable: a layer that cannot be enabled is
left off and the report (``brainstem.sandbox.report()``) says why; a layer
that can be enabled is.  The fork server checks its work at start by locking
down a probe worker and trying what tool code must not be able to do; that
probe's findings are what the report shows.

``BRAINSTEM_SANDBOX_ISOLATION=off`` (read by the runtime when it starts the
fork server) turns these layers off, and ``off:LAYER,...`` only some of them
(``netns``, ``userns``, ``caps``, ``landlock``, ``chroot``, ``seccomp``).
It exists for the benchmark and the tests and WEAKENS THE SANDBOX; the
interpreter restrictions, uid drop, rlimits, empty environment and closed fds
stay on whatever it says.  Any other value means on.

Modules, lowest first (each imports only those above it in this list):

* ``switch`` -- ``ENV_SWITCH``, ``LAYERS``, ``switch_from_env``: which
  layers the runtime turns off (no ctypes: the runtime imports it).
* ``procfs`` -- ``status_fields``, ``netns_id``, ``write_proc``: what /proc
  says of a process (no ctypes: the runtime's report reads it too).
* ``libc`` -- the ctypes plumbing (``prctl``, ``unshare``, raw syscalls),
  the flag values, ``LockDownFailed`` and ``reason``.
* ``syscalls`` -- the syscall table (``SYSCALLS``, ``ARCHES``, ``MACHINE``).
* ``seccomp`` -- the allowlist (``WORKER_ALLOW``, ``SERVER_ONLY``, ``NEVER``,
  the rules), the BPF program (``build_filter``), ``Filter``,
  ``seccomp_arch``, ``worker_filters``.
* ``landlock`` -- ``landlock_abi``, ``Landlock``.
* ``caps`` -- capabilities (``capget``, ``capset``, ``drop_bounding``) and
  the uid switch (``NOBODY``, ``uid_switch_error``).
* ``lockdown`` -- ``Plan``, ``use``, ``become_nobody``, ``lock_worker``: what
  each worker applies (the worker imports this, and nothing above it).
* ``probe`` -- ``probe``, ``self_test``: what a locked-down worker can still do.
* ``report`` -- ``ServerSetup``, ``describe``, ``build_report``: each layer
  on or off, and why.
* ``setup`` -- ``setup_server``, ``setup_failed``, ``preload_codecs``: the
  fork server's once-only setup (the fork server imports this).

The runtime asks the live fork server for the report through
``brainstem.sandbox.isolation_report``; nothing here knows about the
runtime.
"""
