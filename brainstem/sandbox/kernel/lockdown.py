"""The plan each worker follows: what it applies of the kernel layers during its lock-down.

The fork server builds the plan once (``setup.setup_server`` calls
:func:`use`); every worker inherits it through the fork and applies it: first
:func:`become_nobody`, last :func:`lock_worker`.  The worker imports this
module and nothing of the setup above it.
"""

from __future__ import annotations

import os

from brainstem.sandbox.kernel.caps import NOBODY, capset, uid_switch_error
from brainstem.sandbox.kernel.landlock import Landlock, landlock_abi
from brainstem.sandbox.kernel.seccomp import Filter, build_filter, seccomp_arch, worker_rules


class Plan:
    """What each worker applies during its lock-down (built in the fork server).

    ``nobody``: switch to uid/gid 65534 (a root runtime that can).
    ``drop_caps`` is needed only when the fork server could not drop its own
    capabilities: a root worker loses them all at setuid(65534), and
    otherwise a worker inherits the fork server's (none).
    """

    def __init__(self, nobody: bool, drop_caps: bool, landlock: Landlock | None, seccomp: Filter | None):
        self.nobody = nobody
        self.drop_caps = drop_caps
        self.landlock = landlock
        self.seccomp = seccomp


_plan: Plan | None = None


def use(plan: Plan) -> Plan:
    """Make ``plan`` the one every worker forked from now on follows; returns it."""
    global _plan
    _plan = plan
    return plan


def _default_plan() -> Plan:
    """For a lock-down outside a fork server (tests): every worker-level layer the kernel has."""
    abi, _ = landlock_abi()
    arch, _ = seccomp_arch()
    nobody = os.geteuid() == 0 and not uid_switch_error()
    return Plan(nobody, True, Landlock(abi) if abi else None,
                Filter(build_filter(arch, worker_rules())) if arch else None)


def _current_plan() -> Plan:
    global _plan
    if _plan is None:
        _plan = _default_plan()
    return _plan


def become_nobody() -> None:
    """In a worker, first of the layers: uid/gid 65534 and no groups, when the plan says so."""
    if _current_plan().nobody:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def lock_worker() -> None:
    """The last step of a worker's lock-down: what the plan says of capabilities, Landlock, seccomp.

    Needs NO_NEW_PRIVS already set.  Raises if a layer the fork server
    verified cannot be applied: the worker then dies and the call fails.
    """
    plan = _current_plan()
    if plan.drop_caps:
        capset(frozenset())
    if plan.landlock is not None:
        plan.landlock.restrict()
    if plan.seccomp is not None:
        plan.seccomp.install()
