"""The harness that runs the command line in the test process (tests/cli_inprocess.py) against the real process.

Most command-line tests run ``brainstem`` in-process; these check that doing so shows what a process
shows, and leaves the test process as it found it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess

import pytest

from tests.helpers import run_cli, run_cli_process
from tests.wake_helpers import seeded


@pytest.fixture
def url(url):
    """The suite's SQLite store of this test's own, seeded."""
    seeded(url).close()
    return url


@pytest.mark.parametrize("args", [["--help"], ["wake", "--help"], ["kv", "get", "no-such-key"]])
def test_in_process_a_command_prints_and_exits_as_the_process_does(url, args):
    inside, outside = run_cli(*args, env={"BRAINSTEM_KV": url}), run_cli_process(*args, env={"BRAINSTEM_KV": url})
    assert (inside.returncode, inside.stdout, inside.stderr) == (outside.returncode, outside.stdout, outside.stderr)


def test_a_run_sees_only_the_environment_it_is_given_and_leaves_the_process_as_it_was(url, monkeypatch):
    monkeypatch.setenv("BRAINSTEM_KV", "mysql://not-a-store")  # the test process's own: never the command's
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)}
    brainstem_log = logging.getLogger("brainstem")
    before = (list(brainstem_log.handlers), brainstem_log.level, brainstem_log.propagate)
    assert run_cli("kv", "ls", env={"BRAINSTEM_KV": url}).returncode == 0
    # `brainstem run` sets up logging on its stderr and signal handlers before it refuses a bad schedule.
    r = run_cli("run", "--every", "0", env={"BRAINSTEM_KV": url})
    assert r.returncode != 0 and "too short" in r.stderr
    assert os.environ["BRAINSTEM_KV"] == "mysql://not-a-store"
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert (list(brainstem_log.handlers), brainstem_log.level, brainstem_log.propagate) == before
    assert "mysql" in run_cli("kv", "ls", env={"BRAINSTEM_KV": "mysql://x"}).stderr


def test_a_command_that_does_not_end_is_a_timeout_as_from_subprocess_run(url):
    # A daemon whose store is not there waits for it, forever.
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli("run", "--every", "1h", env={"BRAINSTEM_KV": "redis://127.0.0.1:1/0"}, timeout=1)
    assert not logging.getLogger("brainstem").handlers
    assert run_cli("kv", "ls", env={"BRAINSTEM_KV": url}).returncode == 0
