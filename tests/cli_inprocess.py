"""Run ``brainstem ARGS`` inside the test process, as ``python -m brainstem ARGS`` runs in its own.

A subprocess pays about a second of interpreter start and imports; the suite runs the command
line hundreds of times. In this process a run gets what a fresh process would have, and
whatever it changes in the process is undone afterwards:

- the environment: every ``BRAINSTEM_*`` / ``OPENROUTER_*`` variable of the test process removed,
  the test's ``env`` applied (HOME and XDG_* too), all of it restored afterwards;
- stdin is ``input`` (empty without), stdout and stderr are captured, none is a tty (click's
  CliRunner isolation); help text is as wide as a process writing to a pipe makes it (``COLUMNS``,
  else 80 less click's margin), where CliRunner would force 80;
- ``sys.argv``; the exit: ``SystemExit`` and an uncaught exception become the return code, with the
  traceback on stderr as Python prints it;
- process-wide state the command line changes (:data:`PROCESS_GLOBALS`, logging set up by
  ``brainstem run``, signal handlers) and the stores it opened (closed, as the end of a process
  closes them);
- ``timeout``: :class:`subprocess.TimeoutExpired`, as ``subprocess.run`` raises it.

Shared on purpose: the sandbox's fork server (started once per process, with the
``BRAINSTEM_SANDBOX_ISOLATION`` of that moment: a test of that switch runs a process) and the
modules already imported (a test of what a command imports runs a process).

It enters through ``brainstem.__main__.main``, the console script's entry point, so ``wake`` takes
the sleep path first exactly as the installed command does (and then ``brainstem.operator.cli.main``).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import traceback

from click.testing import CliRunner

# Module globals a run sets for the rest of its process. A process that ends forgets them; here
# they are put back after every run. Each is (module, name, how): "value" is restored as it was,
# "set" loses what the run added.
PROCESS_GLOBALS = (
    # lease.use_host_name(): BRAINSTEM_HOSTNAME as a wake's settings read it; a later `status` or
    # `karma --follow` without that variable would still judge lock holders by it.
    ("brainstem.store.lease", "_HOST", "value"),
    # The lease tokens of wakes running in this process: a process that ends holds none, so a wake
    # that ended without forgetting its own must not look alive to the next run.
    ("brainstem.store.lease", "_LIVE_TOKENS", "set"),
    # The ports this process listens on (dashboard, metrics), refused to tools' fetches: a process that
    # ends listens on none. (No in-process test starts a server: those run as processes.)
    ("brainstem.sandbox.own_ports", "_ours", "set"),
)

_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGALRM", "SIGCHLD", "SIGPIPE",
                                                    "SIGUSR1", "SIGUSR2"))
_PREFIXES = ("BRAINSTEM_", "OPENROUTER_")


class _Deadline(BaseException):
    """The run's timeout (a BaseException: the command line's ``except Exception`` must not eat it)."""


def run_cli_inprocess(*args: str, env: dict | None = None, input: str | None = None,
                      timeout: float = 60) -> subprocess.CompletedProcess:
    """(returncode, stdout, stderr) of ``brainstem ARGS`` run in this process; see the module's docstring."""
    argv = [str(a) for a in args]
    overrides: dict[str, str | None] = {k: None for k in os.environ if k.startswith(_PREFIXES)}
    overrides.update(env or {})
    runner = CliRunner()
    with _process_state(), runner.isolation(input=input, env=overrides) as streams, _piped_terminal(), \
            _deadline(timeout, argv):
        code = _run(argv)
        sys.stdout.flush()
        sys.stderr.flush()
    out, err = streams[0].getvalue(), streams[1].getvalue()
    return subprocess.CompletedProcess(["brainstem", *argv], code, out.decode("utf-8", "replace"),
                                       err.decode("utf-8", "replace"))


def _run(argv: list[str]) -> int:
    """``brainstem.__main__.main()`` under ``sys.argv``; its exit status as a process would have it."""
    from brainstem import __main__ as entry

    saved_argv = sys.argv
    sys.argv = ["brainstem", *argv]
    try:
        entry.main()
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code % 256
        print(exc.code, file=sys.stderr)
        return 1
    except (_Deadline, KeyboardInterrupt):
        raise
    except Exception:  # noqa: BLE001 - as the interpreter does: the traceback on stderr, exit 1
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved_argv


@contextlib.contextmanager
def _piped_terminal():
    """The terminal size a process whose stdout is a pipe sees: ``COLUMNS``/``LINES``, else 80x24 (not
    CliRunner's forced 80 columns: click takes 2 off what it is told, so a process wraps help at 78)."""
    from click import formatting

    def size(fallback=(80, 24)):
        def given(name):
            try:
                return int(os.environ.get(name, ""))
            except ValueError:
                return 0
        return os.terminal_size((given("COLUMNS") or fallback[0], given("LINES") or fallback[1]))

    saved = shutil.get_terminal_size
    formatting.FORCED_WIDTH = None  # CliRunner's isolation sets 80 and puts back what was there
    shutil.get_terminal_size = size
    try:
        yield
    finally:
        shutil.get_terminal_size = saved


@contextlib.contextmanager
def _deadline(timeout: float, argv: list[str]):
    """Interrupt the run after ``timeout`` seconds (SIGALRM: only the main thread can take signals)."""
    if threading.current_thread() is not threading.main_thread() or not timeout:
        yield
        return

    def expire(_signum, _frame):
        raise _Deadline()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    except _Deadline:
        raise subprocess.TimeoutExpired(["brainstem", *argv], timeout) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _process_state():
    """Put back after the run what a process that ends would take with it."""
    globals_before = [_save_global(*entry) for entry in PROCESS_GLOBALS]
    signals_before = {s: signal.getsignal(s) for s in _SIGNALS}
    loggers_before = _loggers()
    opened = []
    with _recording_stores(opened):
        try:
            yield
        finally:
            for store in opened:
                with contextlib.suppress(Exception):
                    store.close()
            _restore_loggers(loggers_before)
            for s, handler in signals_before.items():
                if handler is not None and signal.getsignal(s) is not handler:
                    signal.signal(s, handler)
            for restore in globals_before:
                restore()


def _save_global(module_name: str, name: str, how: str):
    """A function that puts ``module.name`` back as it is now."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        raise AssertionError(f"tests/cli_inprocess.py PROCESS_GLOBALS names {module_name}, which is gone: "
                             f"find where {name} went and update the list") from None
    if not hasattr(module, name):
        raise AssertionError(f"tests/cli_inprocess.py PROCESS_GLOBALS names {module_name}.{name}, which is gone")
    value = getattr(module, name)
    if how == "set":
        before = set(value)

        def restore():
            value.difference_update(set(value) - before)
        return restore

    def restore():
        setattr(module, name, value)
    return restore


@contextlib.contextmanager
def _recording_stores(opened: list):
    """Every store the run opens through ``brainstem.store.open_store``, so it can be closed afterwards."""
    import brainstem.store as store_pkg

    original = store_pkg.open_store

    def recording(*args, **kwargs):
        store = original(*args, **kwargs)
        opened.append(store)
        return store
    store_pkg.open_store = recording
    try:
        yield
    finally:
        store_pkg.open_store = original


# The loggers ``brainstem run`` configures (handlers, level, propagation): created before each run, so
# they are among the loggers put back as they were.
_CONFIGURED_LOGGERS = ("brainstem", "apscheduler")


def _loggers() -> dict:
    for name in _CONFIGURED_LOGGERS:
        logging.getLogger(name)
    every = {"": logging.getLogger()}
    every.update({name: lg for name, lg in logging.Logger.manager.loggerDict.items()
                  if isinstance(lg, logging.Logger)})
    return {name: (lg, list(lg.handlers), lg.level, lg.propagate, lg.disabled) for name, lg in every.items()}


def _restore_loggers(before: dict) -> None:
    """Loggers as they were (``brainstem run`` points brainstem's at the captured stderr). A logger first
    made in the run keeps the level its library gave it and loses any handler but a NullHandler."""
    for name, (lg, handlers, level, propagate, disabled) in _loggers().items():
        if name not in before:
            lg.handlers[:] = [h for h in lg.handlers if isinstance(h, logging.NullHandler)]
            continue
        _, handlers, level, propagate, disabled = before[name]
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
        lg.disabled = disabled
