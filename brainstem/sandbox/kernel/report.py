"""What the fork server did to itself and plans for its workers, as the report shows it.

:class:`ServerSetup` is the record ``setup`` fills in; :func:`describe` turns
it and the probe worker's findings into one entry per protection, ``on``,
``off`` or ``not needed`` with the reason, and :func:`build_report` into the
report the fork server hands the runtime (``brainstem.sandbox.report()``).
A layer is reported on only when the probe worker found it holding.
"""

from __future__ import annotations

import os

from brainstem.sandbox.kernel.caps import NOBODY, cap_mask, cap_names
from brainstem.sandbox.kernel.landlock import Landlock
from brainstem.sandbox.kernel.seccomp import NEVER, Filter, worker_rules
from brainstem.sandbox.kernel.switch import ENV_SWITCH
from brainstem.sandbox.kernel.syscalls import ARCHES, MACHINE, SYSCALLS


def on(detail: str) -> dict:
    return {"state": "on", "detail": detail}


def off(detail: str) -> dict:
    return {"state": "off", "detail": detail}


def not_needed(detail: str) -> dict:
    return {"state": "not needed", "detail": detail}


class ServerSetup:
    """What the fork server did to itself and plans for its workers, and why."""

    def __init__(self, disabled: tuple[str, ...]):
        self.disabled = frozenset(disabled)
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.root = os.geteuid() == 0
        # Whether workers can become nobody: why not, for a root runtime that cannot.
        self.switch_error = ""
        self.layers: dict[str, dict] = {}
        self.notes: dict[str, str] = {}
        self.probe: dict | None = None
        self.report_bytes = b"{}"

    def switched_off(self, layer: str) -> bool:
        return layer in self.disabled

    @property
    def nobody(self) -> bool:
        """A root runtime whose workers switch to uid 65534."""
        return self.root and not self.switch_error

    def off_reason(self) -> str:
        return f"switched off ({ENV_SWITCH}); this weakens the sandbox"


def describe(s: ServerSetup, landlock: Landlock | None, chroot_done: bool, fs_off_why: str,
             worker_filter: Filter | None, server_filter: Filter | None, seccomp_why: str,
             keep: frozenset[int]) -> None:
    """Fill in ``s.layers`` from what the setup did and what the probe worker found."""
    p = s.probe or {}
    s.layers["filesystem"] = _filesystem(p, landlock, chroot_done, fs_off_why, worker_filter)
    s.layers["seccomp"] = _seccomp(s, p, worker_filter, server_filter, seccomp_why)
    if "capabilities" not in s.layers:
        s.layers["capabilities"] = _capabilities(s, p, keep)
    s.layers["uid_drop"] = _uid_drop(s, p)
    if p.get("no_new_privs") == 1:
        s.layers["no_new_privs"] = on("set in the fork server and every worker")
    else:
        s.layers["no_new_privs"] = off(f"probe worker saw {p.get('no_new_privs')}")
    s.layers["rlimits"] = _rlimits(p)


def _filesystem(p: dict, landlock: Landlock | None, chroot_done: bool, fs_off_why: str,
                worker_filter: Filter | None) -> dict:
    fs_hidden = (p.get("root_dir") in ("EACCES", "EPERM", "0 entries")
                 and p.get("etc_passwd") in ("EACCES", "EPERM", "ENOENT"))
    if landlock is not None and fs_hidden:
        return on(landlock.describe() + " (the fork server's domain, which every worker inherits)")
    if chroot_done and fs_hidden:
        return on(f"empty root: the fork server chrooted into a deleted directory ({fs_off_why.lstrip('; ')})")
    if landlock is not None or chroot_done:
        return off(f"applied but the probe worker could still list / "
                   f"({p.get('root_dir')}) or read /etc/passwd ({p.get('etc_passwd')})")
    extra = "; workers still cannot open files for writing (seccomp)" if worker_filter else ""
    return off(fs_off_why.lstrip("; ") + extra)


def _seccomp(s: ServerSetup, p: dict, worker_filter: Filter | None, server_filter: Filter | None,
             seccomp_why: str) -> dict:
    if worker_filter is None:
        return off(seccomp_why or "unavailable")
    if not (p.get("seccomp_mode") == 2 and p.get("socket") == "EPERM" and p.get("execve") == "EPERM"
            and p.get("unknown_syscall") == "EPERM"):
        return off(f"installed but the probe worker saw mode {p.get('seccomp_mode')}, "
                   f"socket {p.get('socket')}, execve {p.get('execve')}, "
                   f"an unknown syscall {p.get('unknown_syscall')}")
    column = ARCHES[MACHINE][0]
    n_allowed = sum(1 for name in worker_rules() if SYSCALLS[name][column] is not None)
    how = ("the fork server's filter, inherited, plus each worker's, which takes away fork, kill, "
           "setuid and the rest only the server needs")
    if server_filter is None:
        how = (f"each worker installs it whole: the fork server's own filter failed "
               f"({s.notes.get('server_seccomp_error')})")
    return on(
        f"each worker: an allowlist of {n_allowed} syscalls (its own memory, clocks, signal handlers "
        f"and ids, I/O on the fds it holds, a read-only open; prctl and prlimit64 on itself only); "
        f"anything else fails with EPERM ({', '.join(g for g, _ in NEVER)}, new syscalls ...), "
        f"opening for writing with EACCES, clone3 with ENOSYS; a foreign architecture or x32 kills "
        f"the process ({how})"
    )


def _capabilities(s: ServerSetup, p: dict, keep: frozenset[int]) -> dict:
    eff, bnd = _hex(s.notes["server_capeff"]), _hex(s.notes["server_capbnd"])
    if eff is None or eff & ~cap_mask(keep) != 0 or p.get("caps") != 0:
        return off(f"fork server CapEff {s.notes['server_capeff']}, probe worker {p.get('caps')}"
                   + (f": {s.notes['caps_error']}" if "caps_error" in s.notes else ""))
    if s.nobody:
        detail = f"fork server keeps {cap_names(eff)} (CapEff {eff:016x}"
        detail += f", bounding set {bnd:016x})" if bnd is not None else ")"
        if bnd is not None and bnd & ~cap_mask(keep):
            detail += "; its bounding set could not be reduced (no CAP_SETPCAP)"
    elif s.layers["user_namespace"]["state"] == "on":
        detail = "fork server dropped every capability of its user namespace"
    elif s.root:
        detail = "fork server dropped every capability (workers cannot be made nobody here)"
    else:
        detail = "the runtime is not root: the fork server holds none"
    return on(detail + "; workers hold none")


def _uid_drop(s: ServerSetup, p: dict) -> dict:
    if not s.nobody:
        return off(uid_kept(s))
    uid = p.get("uid")
    if uid == NOBODY:
        return on(f"workers run as uid/gid {NOBODY} (nobody), no supplementary groups")
    return off(f"the probe worker ran as uid {uid}")


def _rlimits(p: dict) -> dict:
    lim = p.get("rlimits") or {}
    if lim.get("NPROC") == 0 and lim.get("FSIZE") == 0 and lim.get("CORE") == 0:
        return on(f"address space (the call's memory_mb), CPU (timeout + 1 s), NPROC 0, FSIZE 0, "
                  f"NOFILE {lim.get('NOFILE')}, CORE 0")
    return off(f"probe worker saw {lim}")


def uid_kept(s: ServerSetup) -> str:
    """Why workers keep the runtime's uid, and what keeps them from its files and processes."""
    who = (f"the runtime is uid 0 but cannot make workers uid {NOBODY} ({s.switch_error})" if s.root
           else "the runtime is not root")
    if s.layers.get("user_namespace", {}).get("state") == "on":
        return (f"{who}: workers keep its uid {s.uid} (seen as {NOBODY} inside their user namespace); "
                f"Landlock and seccomp, not the uid, keep them from its files and processes")
    return f"{who}: workers share its uid {s.uid}"


def _hex(text: str) -> int | None:
    try:
        return int(text, 16)
    except (TypeError, ValueError):
        return None


_ORDER = ("uid_drop", "user_namespace", "network_namespace", "seccomp", "filesystem",
          "capabilities", "no_new_privs", "rlimits")


def build_report(s: ServerSetup) -> dict:
    protections = {name: s.layers[name] for name in _ORDER if name in s.layers}
    return {
        "runtime": ("root" if s.nobody else f"uid 0 that cannot switch to uid {NOBODY}" if s.root
                    else f"non-root (uid {s.uid})"),
        "switch": ("on" if not s.disabled else f"{ENV_SWITCH} turns off: {', '.join(sorted(s.disabled))}"),
        "protections": protections,
        "off": [name for name, v in protections.items() if v["state"] == "off"],
        "probe": s.probe,
        "notes": s.notes,
    }
