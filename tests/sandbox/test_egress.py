"""Egress policy: URL spellings that must be refused, allow-list hits, redirects, caps."""

from __future__ import annotations

import http.server
import json
import threading

import httpx
import pytest

from brainstem.sandbox.egress import EgressDenied, FetchError, _default_resolver, check_url
from brainstem.sandbox.fetch import fetch

PUBLIC_IP = "93.184.215.14"


def fake_resolver(table: dict[str, list[str]]):
    calls = []

    def resolve(host, port):
        calls.append(host)
        key = host.rstrip(".").lower()
        if key in table:
            return table[key]
        # literal IPs and odd spellings resolve as the system would
        return _default_resolver(host, port)

    resolve.calls = calls
    return resolve


RESOLVER = fake_resolver({
    "example.com": [PUBLIC_IP],
    "api.example.com": [PUBLIC_IP],
    "api.example.com.evil.test": ["127.0.0.1"],
    "rebind.test": [PUBLIC_IP, "10.0.0.7"],
    "internal.corp": ["10.1.2.3"],
})


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://127.0.0.1/", "loopback"),
        ("http://localhost/", "loopback"),
        ("http://localhost./admin", "loopback"),
        ("http://2130706433/", "loopback"),  # decimal
        ("http://0x7f.1/", "loopback"),  # hex, short form
        ("http://0x7f000001/", "loopback"),  # hex
        ("http://0177.0.0.1/", ""),  # octal: refused (invalid or loopback)
        ("http://127.1/", "loopback"),
        ("http://0/", "unspecified"),
        ("http://0.0.0.0:8080/", "unspecified"),
        ("http://[::1]/", "loopback"),
        ("http://[::]/", "unspecified"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),  # IPv4-mapped IPv6
        ("http://[::ffff:7f00:1]/", "loopback"),
        ("http://[64:ff9b::a9fe:a9fe]/", "metadata"),  # NAT64 of 169.254.169.254
        ("http://[2002:a9fe:a9fe::]/", "metadata"),  # 6to4 of 169.254.169.254
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("https://api.example.com@169.254.169.254/", "metadata"),  # userinfo trick
        ("http://user:pass@10.0.0.1/", "private"),
        ("http://metadata.google.internal/computeMetadata/v1/", "metadata"),
        ("http://METADATA.google.internal./", "metadata"),
        ("http://10.0.0.1/", "private"),
        ("http://172.16.5.4/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://100.64.0.1/", "shared"),
        ("http://169.254.1.1/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://224.0.0.1/", "multicast"),
        ("http://240.0.0.1/", "reserved"),
        ("http://api.example.com.evil.test/", "loopback"),  # suffix trick: just another host
        ("http://rebind.test/", "private"),  # any private answer poisons the host
        ("http://internal.corp/", "private"),
        ("file:///etc/passwd", "scheme"),
        ("ftp://example.com/", "scheme"),
        ("gopher://example.com:70/", "scheme"),
        ("http://evil.com\\@example.com/", "backslash"),
        ("http://ex%61mple.com/", "percent"),
        ("http://exa mple.com/", "whitespace"),
        ("http:///nohost", ""),
    ],
)
def test_refused_spellings(url, reason):
    with pytest.raises(EgressDenied) as e:
        check_url(url, [], resolver=RESOLVER)
    assert reason in str(e.value)


@pytest.mark.parametrize(
    "url, allow",
    [
        ("https://example.com/path?q=1", []),
        ("https://api.example.com/", []),
        ("http://127.0.0.1:8080/", ["127.0.0.1/32"]),
        ("http://127.0.0.1/", ["127.0.0.1"]),
        ("http://2130706433/", ["127.0.0.0/8"]),
        ("http://localhost/", ["localhost"]),
        ("http://localhost./", ["localhost"]),
        ("http://internal.corp/", ["10.0.0.0/8"]),
        ("http://internal.corp/", ["internal.corp"]),
        ("http://[::1]:9000/", ["::1/128"]),
    ],
)
def test_allowed(url, allow):
    check_url(url, allow, resolver=RESOLVER)


def test_allow_entry_for_one_host_does_not_open_others():
    with pytest.raises(EgressDenied):
        check_url("http://127.0.0.2/", ["127.0.0.1/32"], resolver=RESOLVER)
    with pytest.raises(EgressDenied):
        check_url("http://10.0.0.1/", ["localhost"], resolver=RESOLVER)


# --------------------------------------------------------------------------- fetch with a mock transport


def mock(handler):
    seen = []

    def wrapped(request: httpx.Request):
        seen.append(request)
        return handler(request)

    t = httpx.MockTransport(wrapped)
    t.seen = seen
    return t


def test_fetch_connects_to_checked_ip_with_host_header_and_sni():
    resolver = fake_resolver({"example.com": [PUBLIC_IP]})
    t = mock(lambda r: httpx.Response(200, json={"a": 1}, headers={"X-Thing": "v"}))
    out = fetch("https://example.com/data?x=1", headers={"Host": "evil.internal", "Accept": "x"},
                transport=t, resolver=resolver)
    req = t.seen[0]
    assert req.url.host == PUBLIC_IP and req.url.path == "/data" and req.url.query == b"x=1"
    assert req.headers["host"] == "example.com"
    assert req.headers["accept"] == "x"
    assert req.extensions["sni_hostname"] == "example.com"
    assert out["status"] == 200 and out["json"] == {"a": 1}
    assert json.loads(out["text"]) == {"a": 1}
    assert type(out["headers"]) is dict and out["headers"]["x-thing"] == "v"
    assert all(type(k) is str and type(v) is str for k, v in out["headers"].items())
    assert out["truncated"] is False
    assert resolver.calls == ["example.com"]


def test_fetch_non_json_body_has_json_none():
    t = mock(lambda r: httpx.Response(200, text="<html>hi</html>"))
    out = fetch("http://example.com/", transport=t, resolver=RESOLVER)
    assert out["text"] == "<html>hi</html>" and out["json"] is None


def test_redirect_to_private_is_refused():
    t = mock(lambda r: httpx.Response(302, headers={"Location": "http://169.254.169.254/latest/"}))
    with pytest.raises(EgressDenied, match="metadata"):
        fetch("http://example.com/", transport=t, resolver=RESOLVER)
    assert len(t.seen) == 1


def test_redirect_to_loopback_spelling_is_refused():
    t = mock(lambda r: httpx.Response(301, headers={"Location": "http://0x7f.1:6379/"}))
    with pytest.raises(EgressDenied, match="loopback"):
        fetch("http://example.com/", transport=t, resolver=RESOLVER)


def test_redirects_followed_and_rechecked_with_method_rules():
    def handler(request):
        if request.url.path == "/start":
            return httpx.Response(303, headers={"Location": "https://api.example.com/next"})
        return httpx.Response(200, text=f"{request.method} {request.headers.get('authorization')}")

    t = mock(handler)
    out = fetch("http://example.com/start", method="POST", json={"a": 1},
                headers={"Authorization": "Bearer s3cret"}, transport=t, resolver=RESOLVER)
    assert out["text"] == "GET None"  # 303 -> GET, and credentials dropped across origins
    assert out["url"] == "https://api.example.com/next"
    assert [r.method for r in t.seen] == ["POST", "GET"]


def test_too_many_redirects():
    t = mock(lambda r: httpx.Response(302, headers={"Location": "/again"}))
    with pytest.raises(FetchError, match="too many redirects"):
        fetch("http://example.com/", transport=t, resolver=RESOLVER)
    assert len(t.seen) == 6


def test_response_size_capped():
    t = mock(lambda r: httpx.Response(200, content=b'{"x": "' + b"a" * 100_000 + b'"}'))
    out = fetch("http://example.com/", transport=t, resolver=RESOLVER, max_bytes=1000)
    assert out["truncated"] is True and len(out["text"]) == 1000 and out["json"] is None


def test_transport_error_message_has_no_headers():
    def handler(request):
        raise httpx.ConnectError("connection refused", request=request)

    t = mock(handler)
    with pytest.raises(FetchError) as e:
        fetch("http://example.com/", headers={"Authorization": "Bearer s3cret"}, transport=t,
              resolver=RESOLVER)
    # Fixed text by kind: the stack's own message is never passed on.
    assert str(e.value) == "fetch failed: could not connect"


def test_method_checked():
    with pytest.raises(FetchError):
        fetch("http://example.com/", method="TRACE", resolver=RESOLVER, transport=mock(lambda r: None))


def test_dns_rebinding_second_answer_never_used():
    answers = [[PUBLIC_IP], ["127.0.0.1"]]

    def resolver(host, port):
        return answers.pop(0)

    t = mock(lambda r: httpx.Response(200, text="ok"))
    out = fetch("http://rebinding.example/", transport=t, resolver=resolver)
    assert out["text"] == "ok"
    assert t.seen[0].url.host == PUBLIC_IP  # connected to the address that was checked
    assert answers == [["127.0.0.1"]]  # the client never resolved again


# --------------------------------------------------------------------------- a real loopback server


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = json.dumps({"path": self.path, "host": self.headers.get("Host")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def loopback_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_loopback_refused_without_allow(loopback_server):
    with pytest.raises(EgressDenied):
        fetch(loopback_server + "/x", allow=[])


def test_loopback_allowed_by_operator(loopback_server):
    out = fetch(loopback_server + "/hello?a=b", allow=["127.0.0.1"])
    assert out["status"] == 200
    assert out["json"]["path"] == "/hello?a=b"
    assert out["json"]["host"] == loopback_server.removeprefix("http://")
