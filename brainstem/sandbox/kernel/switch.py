"""``BRAINSTEM_SANDBOX_ISOLATION``: which kernel layers the runtime turns off.

Read by the runtime when it starts the fork server (the server itself gets an
empty environment), so this module imports no ctypes and nothing else of the
kernel layer.  ``off`` turns every layer off, ``off:LAYER,...`` only those
named; any other value means on.  It exists for the benchmark and the tests
and WEAKENS THE SANDBOX.
"""

from __future__ import annotations

from brainstem.core import environment

ENV_SWITCH = environment.SANDBOX_ISOLATION
LAYERS = ("netns", "userns", "caps", "landlock", "chroot", "seccomp")


def switch_from_env(environ=None) -> tuple[str, ...]:
    """The layers ``BRAINSTEM_SANDBOX_ISOLATION`` turns off (read by the runtime)."""
    value = ((environ.get(ENV_SWITCH) if environ is not None else environment.raw(ENV_SWITCH)) or "").strip().lower()
    if value == "off":
        return LAYERS
    if value.startswith("off:"):
        return tuple(n for n in LAYERS if n in {p.strip() for p in value[4:].split(",")})
    return ()
