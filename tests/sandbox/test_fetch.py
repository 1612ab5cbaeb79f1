"""Egress that cannot hold or bloat the runtime: one deadline for the whole exchange, bodies capped
after decoding, and the tool write quota. Black box through ``brainstem tool run`` where it matters
(the runtime process's own time and memory are what is at stake)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from brainstem.core import keys
from brainstem.sandbox import egress
from brainstem.sandbox.fetch import fetch
from brainstem.state.seed import seed
from brainstem.store import open_store
from tests.doubles.hostile import Drip, bomb_host, gzip_bomb
from tests.helpers import run_cli

RSS_LIMIT_MB = 400


@pytest.fixture
def kv(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    seed(store)
    yield store, {"BRAINSTEM_KV": url, "BRAINSTEM_FETCH_ALLOW": "127.0.0.1"}
    store.close()


@pytest.mark.slow
def test_a_header_drip_cannot_hold_a_2s_tool_for_more_than_a_few_seconds(kv):
    store, env = kv
    drip = Drip(every=0.5)
    try:
        store.put(keys.tool_meta("web_fetch"), json.dumps({**store.get_json(keys.tool_meta("web_fetch")),
                                                           "timeout_ms": 2000}))
        t0 = time.monotonic()
        r = run_cli("tool", "run", "web_fetch", "--input", json.dumps({"url": drip.base + "/"}), env=env)
        took = time.monotonic() - t0
    finally:
        drip.close()
    assert took < 6, f"held for {took:.1f} s"  # 2 s of tool time, plus process start-up
    assert "timed out" in r.stdout + r.stderr, (r.stdout, r.stderr)


def test_fetch_has_one_deadline_for_the_whole_exchange_not_one_per_read():
    drip = Drip(every=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(egress.FetchTimeout):
            fetch(drip.base + "/", timeout=1.0, allow=["127.0.0.1"])
        assert time.monotonic() - t0 < 1.6
    finally:
        drip.close()


def test_name_resolution_is_inside_the_deadline(monkeypatch):
    def hang(*args, **kwargs):
        time.sleep(5)
        raise socket.gaierror("too late")
    monkeypatch.setattr(egress.socket, "getaddrinfo", hang)
    t0 = time.monotonic()
    with pytest.raises(egress.FetchTimeout):
        fetch("http://slow-dns.example/", timeout=0.5)
    assert time.monotonic() - t0 < 1.2


@pytest.fixture(scope="module")
def bomb():
    return gzip_bomb(1 << 30)


@pytest.mark.slow
def test_a_gzip_bomb_leaves_the_runtime_small_and_the_tool_a_truncated_page(kv, bomb):
    store, env = kv
    assert len(bomb) < 64 * 1024  # a few KB on the wire ...
    host = bomb_host(bomb)
    try:
        # ... 1 GiB once inflated. Run the CLI in a child that reports its own peak RSS.
        code = ("import resource, sys\n"
                "sys.argv = ['brainstem'] + sys.argv[1:]\n"
                "from brainstem.operator.cli import main\n"
                "try:\n    rc = main()\nexcept SystemExit as e:\n    rc = e.code\n"
                "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
                "sys.exit(rc)\n")
        full = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
        full.update(env)
        r = subprocess.run([sys.executable, "-c", code, "tool", "run", "web_fetch", "--input",
                            json.dumps({"url": host.base + "/", "max_chars": 1000})],
                           env=full, capture_output=True, text=True, timeout=60)
    finally:
        host.close()
    peak_kb = int(r.stderr.split("PEAK_RSS_KB")[1].split()[0])
    assert peak_kb < RSS_LIMIT_MB * 1024, f"runtime peaked at {peak_kb // 1024} MB"
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out.get("truncated") is True or len(out.get("text", out.get("body", ""))) <= 1000, out


def test_decoding_is_capped_after_decompression_in_process():
    host = bomb_host(gzip_bomb(64 << 20))
    try:
        out = fetch(host.base + "/", allow=["127.0.0.1"], max_bytes=100_000)
    finally:
        host.close()
    assert out["truncated"] is True and len(out["text"]) == 100_000 and set(out["text"]) == {"\0"}


def test_unknown_or_too_many_content_encodings_are_refused():
    from tests.doubles.hostile import Host

    def route(h):
        enc = {"/br": "br", "/many": "gzip, gzip, gzip, gzip"}[h.path]
        h._send(200, b"xxxx", {"Content-Encoding": enc})
    host = Host("127.0.0.1", route)
    try:
        for path, why in (("/br", "does not decode"), ("/many", "encoded 4 times")):
            with pytest.raises(egress.FetchError, match=why):
                fetch(host.base + path, allow=["127.0.0.1"])
    finally:
        host.close()


# --- write quota ----------------------------------------------------------------------------------

WRITER = ("def execute(args, ctx):\n"
          "    chunk = 'x' * args['size']\n"
          "    n = 0\n"
          "    try:\n"
          "        for i in range(args['count']):\n"
          "            ctx.kv.put('blob' + str(i), chunk)\n"
          "            n += 1\n"
          "    except Exception as e:\n"
          "        return {'written': n, 'error': str(e)}\n"
          "    return {'written': n}\n")


def test_a_tool_call_cannot_write_past_its_quota(kv):
    store, env = kv
    store.put(keys.tool_code("hog"), WRITER)
    store.put(keys.tool_meta("hog"), json.dumps({"kv_access": "own", "timeout_ms": 30000}))
    r = run_cli("tool", "run", "hog", "--input", json.dumps({"size": 400_000, "count": 100}), "-v",
                env={**env, "BRAINSTEM_TOOL_WRITE_QUOTA": str(2 * 1024 * 1024)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["written"] == 5  # 5 x 400 KB fit in 2 MiB; the sixth does not
    assert "write quota exceeded" in out["error"] and "BRAINSTEM_TOOL_WRITE_QUOTA" in out["error"]
    assert "quota_exceeded" in r.stderr
    assert len(store.list_all("tooldata:hog:")) == 5
