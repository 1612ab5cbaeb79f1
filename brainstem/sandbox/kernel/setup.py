"""The fork server's once-only setup: isolate itself, plan the workers' lock-down, check both.

:func:`setup_server` runs in the fork server after every import the workers
need and before its first fork, in this order: namespaces (network, and user
when workers cannot be made nobody), the filesystem (Landlock, else an empty
root; codecs imported first), capabilities, ``NO_NEW_PRIVS``, seccomp.  It
then checks all that on a probe worker, backing off seccomp, then Landlock,
if the probe worker breaks; locks the fork server itself; and keeps the
report.  A layer that cannot be enabled is left off and reported, never an
error: :func:`setup_failed` covers a bug in the setup itself.
"""

from __future__ import annotations

import encodings
import json
import os
import pkgutil
from collections.abc import Callable

from brainstem.sandbox.kernel.caps import NOBODY, ROOT_SERVER_CAPS, capget, capset, drop_bounding, uid_switch_error
from brainstem.sandbox.kernel.landlock import Landlock, landlock_abi
from brainstem.sandbox.kernel.libc import CLONE_NEWNET, CLONE_NEWUSER, PR_SET_NO_NEW_PRIVS, prctl, reason, unshare
from brainstem.sandbox.kernel.lockdown import Plan, use
from brainstem.sandbox.kernel.probe import self_test
from brainstem.sandbox.kernel.procfs import netns_id, status_fields, write_proc
from brainstem.sandbox.kernel.report import ServerSetup, build_report, describe, not_needed, off, on, uid_kept
from brainstem.sandbox.kernel.seccomp import Filter, build_filter, seccomp_arch, worker_filters, worker_rules
from brainstem.sandbox.kernel.syscalls import MACHINE

# The worker's lock-down (chan_fd, server_pid, timeout_ms, memory_mb), handed in by the fork server:
# the worker sits above this package.
LockDown = Callable[[int, int, int, int], None]


def setup_server(disabled: tuple[str, ...], lock_down: LockDown) -> ServerSetup:
    """Isolate the fork server and prepare the workers' plan; never raises for a missing feature.

    Call after every import the workers need and before the first fork.
    ``lock_down`` is the worker's lock-down, which the probe worker goes through.
    """
    s = ServerSetup(disabled)
    if s.root:
        s.switch_error = uid_switch_error()
    userns = _enter_namespaces(s)
    landlock, chroot_done, fs_off_why = _prepare_filesystem(s, userns)
    keep, drop_in_workers = _reduce_capabilities(s)
    try:
        prctl(PR_SET_NO_NEW_PRIVS, 1)
    except OSError:  # pragma: no cover - kernels before 3.5
        pass
    server_filter, worker_filter, seccomp_why = _prepare_seccomp(s)

    # -- check it all on a probe worker; if that fails, back off seccomp, then Landlock too
    plan, (ll, sf, wf), failures = _check_on_probe(s, lock_down, drop_in_workers, landlock, server_filter,
                                                   worker_filter)
    if worker_filter is not None and wf is None:
        seccomp_why = f"the filter broke the probe worker ({failures[0]})"
    if landlock is not None and ll is None:
        fs_off_why = f"Landlock broke the probe worker ({failures[-1]})"
    landlock, server_filter, worker_filter = ll, sf, wf

    server_filter, worker_filter = _lock_self(s, plan, landlock, server_filter, worker_filter)
    describe(s, landlock, chroot_done, fs_off_why, worker_filter, server_filter, seccomp_why, keep)
    s.report_bytes = json.dumps(build_report(s)).encode()
    return s


def _enter_namespaces(s: ServerSetup) -> bool:
    """A network namespace, owned by a user namespace unless workers can be made nobody (a root
    runtime that cannot takes the non-root path); whether a user namespace was entered."""
    outside_net = netns_id()
    userns = False
    netns_error = ""
    if s.nobody:
        s.layers["user_namespace"] = not_needed("the runtime is root: workers switch to uid 65534")
    elif s.switched_off("userns"):
        s.layers["user_namespace"] = off(s.off_reason())
    else:
        flags = CLONE_NEWUSER | (0 if s.switched_off("netns") else CLONE_NEWNET)
        try:
            unshare(flags)
            userns = True
            write_proc("/proc/self/setgroups", "deny")
            write_proc("/proc/self/uid_map", f"{NOBODY} {s.uid} 1\n")
            write_proc("/proc/self/gid_map", f"{NOBODY} {s.gid} 1\n")
            s.layers["user_namespace"] = on(
                f"fork server and workers run as uid/gid {NOBODY} in a user namespace, which is the "
                f"runtime's uid {s.uid} outside it"
            )
        except OSError as e:
            if userns:
                s.layers["user_namespace"] = off(f"entered but the id map was refused: {reason(e)}")
            else:
                s.layers["user_namespace"] = off(f"unshare(CLONE_NEWUSER) refused: {reason(e)}")
                netns_error = f"no user namespace to own one ({reason(e)})"
    if s.switched_off("netns"):
        s.layers["network_namespace"] = off(s.off_reason())
        return userns
    if not userns:
        try:
            unshare(CLONE_NEWNET)
        except OSError as e:
            netns_error = netns_error or f"unshare(CLONE_NEWNET) refused: {reason(e)}"
    inside_net = netns_id()
    if inside_net != outside_net and inside_net != "?":
        s.layers["network_namespace"] = on(
            f"fork server and workers share {inside_net}, which has no interface up "
            f"(the runtime's is {outside_net}); workers keep only their channel socket"
        )
    else:
        s.layers["network_namespace"] = off(netns_error or "namespace unchanged")
    return userns


def _prepare_filesystem(s: ServerSetup, userns: bool) -> tuple[Landlock | None, bool, str]:
    """(the Landlock ruleset to apply, whether the empty root was entered, why either is off).

    Imports first: nothing can be read afterwards.
    """
    landlock: Landlock | None = None
    fs_off_why = ""
    if s.switched_off("landlock"):
        fs_off_why = "Landlock " + s.off_reason()
    else:
        abi, why = landlock_abi()
        if abi:
            landlock = Landlock(abi)
        else:
            fs_off_why = why
    chroot_done = False
    if landlock is not None or not s.switched_off("chroot"):
        s.notes["codecs"] = f"{preload_codecs()} codecs imported before the lock-down"
    if landlock is None and not s.switched_off("chroot"):
        if s.root or userns:
            try:
                _enter_empty_root()
                chroot_done = True
            except OSError as e:
                fs_off_why += f"; chroot to an empty directory failed: {reason(e)}"
        else:
            fs_off_why += "; no chroot either (needs root or a user namespace)"
    elif landlock is None:
        fs_off_why += "; chroot " + s.off_reason()
    return landlock, chroot_done, fs_off_why


def _reduce_capabilities(s: ServerSetup) -> tuple[frozenset[int], bool]:
    """(the capabilities the fork server keeps, whether each worker must drop them itself)."""
    keep = ROOT_SERVER_CAPS if s.nobody else frozenset()
    if s.switched_off("caps"):
        s.layers["capabilities"] = off(s.off_reason())
    else:
        try:
            _, permitted = capget()
            keep = frozenset(c for c in keep if permitted >> c & 1)
            drop_bounding(keep)
            capset(keep)
        except OSError as e:
            s.notes["caps_error"] = reason(e)
    drop_in_workers = not s.switched_off("caps") and "caps_error" in s.notes
    status = status_fields()
    s.notes["server_capeff"] = status.get("CapEff", "?")
    s.notes["server_capbnd"] = status.get("CapBnd", "?")
    return keep, drop_in_workers


def _prepare_seccomp(s: ServerSetup) -> tuple[Filter | None, Filter | None, str]:
    """(the fork server's filter, each worker's addition, why there are none)."""
    if s.switched_off("seccomp"):
        return None, None, s.off_reason()
    arch, why = seccomp_arch()
    if not arch:
        return None, None, why
    server_filter, worker_filter = worker_filters(arch)
    return server_filter, worker_filter, why


def _check_on_probe(s: ServerSetup, lock_down: LockDown, drop_in_workers: bool, landlock: Landlock | None,
                    server_filter: Filter | None, worker_filter: Filter | None,
                    ) -> tuple[Plan, tuple[Landlock | None, Filter | None, Filter | None], list[str]]:
    """Lock down a probe worker with everything, else without seccomp, else without Landlock either.

    Returns (the plan in use, the (Landlock, server filter, worker filter) the probe worker
    survived or the last tried, the failures on the way); ``s.probe`` gets its findings.
    """
    attempts = [(landlock, server_filter, worker_filter)]
    if worker_filter is not None:
        attempts.append((landlock, None, None))
    if landlock is not None:
        attempts.append((None, None, None))
    failures: list[str] = []
    found = None
    for ll, sf, wf in attempts:
        plan = use(Plan(s.nobody, drop_in_workers, None, wf))  # Landlock: the fork server's domain, inherited
        found, why = self_test(lock_down, _server_lock(ll, sf), timeout=5.0)
        if found is not None:
            break
        failures.append(why)
    s.probe = found
    if found is None:
        s.notes["probe_error"] = failures[-1]
    return plan, (ll, sf, wf), failures


def _lock_self(s: ServerSetup, plan: Plan, landlock: Landlock | None, server_filter: Filter | None,
               worker_filter: Filter | None) -> tuple[Filter | None, Filter | None]:
    """Lock the fork server itself; (server filter, worker filter) as they stand after it: a server
    filter that failed to install leaves each worker installing the whole one."""
    if landlock is not None:
        try:
            landlock.restrict()
        except OSError as e:
            s.notes["server_landlock_error"] = reason(e)
    if server_filter is not None:
        try:
            server_filter.install()
        except OSError as e:
            s.notes["server_seccomp_error"] = reason(e)
            server_filter = None
            worker_filter = plan.seccomp = Filter(build_filter(MACHINE, worker_rules()))
    return server_filter, worker_filter


def _server_lock(landlock: Landlock | None, server_filter: Filter | None) -> Callable[[], None]:
    """What the fork server will do to itself (and its workers inherit), for the probe to do first."""
    def lock() -> None:
        if landlock is not None:
            landlock.restrict()
        if server_filter is not None:
            server_filter.install()
    return lock


def setup_failed(disabled: tuple[str, ...], error: BaseException) -> ServerSetup:
    """When setup_server itself failed: workers get no new layer, and the report says why."""
    s = ServerSetup(disabled)
    if s.root:
        try:
            s.switch_error = uid_switch_error()
        except Exception as e:  # noqa: BLE001 - then workers keep the uid rather than fail
            s.switch_error = f"could not try: {reason(e)}"
    use(Plan(s.nobody, False, None, None))
    why = f"fork server isolation setup failed: {reason(error)}"
    for name in ("user_namespace", "network_namespace", "seccomp", "filesystem", "capabilities"):
        s.layers[name] = off(why)
    s.layers["uid_drop"] = (on(f"workers run as uid/gid {NOBODY} (nobody)") if s.nobody
                            else off(uid_kept(s)))
    s.layers["no_new_privs"] = on("set in every worker")
    s.layers["rlimits"] = on("address space, CPU, NPROC 0, FSIZE 0, NOFILE, CORE 0")
    s.report_bytes = json.dumps(build_report(s)).encode()
    return s


def _enter_empty_root() -> None:
    """chroot into a directory that is deleted first: empty, and nothing can be created in it."""
    import tempfile  # noqa: PLC0415 -- only without Landlock: each fork copies what the fork server holds

    path = tempfile.mkdtemp(prefix="brainstem-empty-")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rmdir(path)
        os.fchdir(fd)
        os.chroot(".")
        os.chdir("/")
    finally:
        os.close(fd)


def preload_codecs() -> int:
    """Import every standard codec: a tool's ``.encode('utf-16-le')`` cannot import it later."""
    n = 0
    for module in pkgutil.iter_modules(encodings.__path__):
        try:
            __import__(f"encodings.{module.name}")
            n += 1
        except Exception:  # noqa: BLE001 - mbcs/oem are Windows-only
            pass
    return n
