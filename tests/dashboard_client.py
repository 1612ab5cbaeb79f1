"""The dashboard app in-process, and a client holding its token as the operator's browser does.

Every dashboard request needs the token, so a test that reads pages first opens the ``?token=`` link
``brainstem dashboard`` prints (:func:`client`), which leaves the cookie in the client's jar; from then
on its POSTs are cookie-authenticated and need the page's CSRF token, as a browser's do. ``logged_in=False``
gives a client without it. :func:`serving` runs the real command as a process and hands back the address
it printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import httpx

from brainstem.core.settings import load_settings
from brainstem.operator.dashboard import auth
from brainstem.operator.dashboard.app import make_app
from tests.helpers import stop

with warnings.catch_warnings():
    # Starlette 1.x warns that its TestClient will move from httpx to httpx2; the project pins httpx.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TOKEN = "dash-token-7f3a9c1e5b2d4f6a8c0e"
LOOPBACK = "http://127.0.0.1:8765"
BEARER = {"authorization": f"Bearer {TOKEN}"}


def dashboard_settings(monkeypatch, **env: str):
    """The settings a dashboard test starts from: no token, env file or tool secrets from this process's
    environment; then ``env``."""
    for name in ("BRAINSTEM_DASHBOARD_TOKEN", "BRAINSTEM_ENV_FILE", "BRAINSTEM_TOOL_SECRETS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings()


def app_for(settings, store, *, token: str = TOKEN, loopback_only: bool = True):
    """The app over one store (the default agent), as ``brainstem dashboard`` builds it."""
    return make_app(settings, {"": store}, token=token, loopback_only=loopback_only)


def client(app, base_url: str = LOOPBACK, *, logged_in: bool = True) -> TestClient:
    """A client of ``app``; logged in (the cookie the printed link sets) unless told otherwise."""
    c = TestClient(app, base_url=base_url, follow_redirects=False)
    if logged_in:
        r = c.get(f"/?{auth.TOKEN_QUERY}={quote(app.state.dashboard.gate.token, safe='')}")
        assert r.status_code == 303 and c.cookies.get(auth.TOKEN_COOKIE), (r.status_code, r.text[:200])
    return c


def printed_address(output: str) -> str | None:
    """The address ``brainstem dashboard`` printed (with ``?token=`` when it made the token), if it has."""
    found = re.search(r"brainstem dashboard on (http://\S+)", output)
    return found.group(1) if found else None


def printed_token(address: str) -> str:
    return parse_qs(urlsplit(address).query)[auth.TOKEN_QUERY][0]


@contextmanager
def serving(env: dict[str, str], log: Path, *args: str, timeout: float = 30):
    """``brainstem dashboard --port 0 ARGS`` as a process with exactly ``env`` (plus PATH and PYTHONPATH when
    set, so that the code under test is the code it runs), output in ``log``; yields (process, the address
    it printed) once it answers."""
    full = {k: os.environ[k] for k in ("PATH", "PYTHONPATH") if k in os.environ}
    full.update(env)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "brainstem", "dashboard", "--port", "0", *args], env=full,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline, address = time.monotonic() + timeout, None
        while time.monotonic() < deadline and proc.poll() is None:
            address = address or printed_address(log.read_text(errors="replace"))
            if address:
                try:
                    httpx.get(address.split("?")[0], timeout=2)
                    break
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        assert address and proc.poll() is None, f"the dashboard did not start: {log.read_text(errors='replace')}"
        yield proc, address
    finally:
        stop(proc)
