"""``brainstem dashboard``: what the agent did, spent and changed, in a browser."""

from __future__ import annotations

from urllib.parse import urlencode

import click


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Loopback or not, every request needs the dashboard token.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to listen on (0: any free one). A port already in use is exit 2, before anything is served.")
@click.option("--agent", "agents", multiple=True,
              help="Show this agent (keys under NAME:); repeat for several, switched between in the page. "
                   "Default: the store's agent (BRAINSTEM_KV_PREFIX).")
@click.pass_obj
def dashboard(c, host: str, port: int, agents: tuple[str, ...]) -> None:
    """Serve the dashboard: status, sessions, timelines, live karma, self-modification, the store, review.

    Every request needs the dashboard token, on loopback too (anything on
    this machine can reach loopback, the agent's tools included): without it
    the answer is 401 and nothing from the store. The token is
    BRAINSTEM_DASHBOARD_TOKEN (at least 16 characters) when set; else one is
    made at start and printed once, in the address to open
    (http://127.0.0.1:8765/?token=...). Opening that address sets a cookie
    for the rest of the visit and drops the token from the address bar.
    Scripts send "Authorization: Bearer TOKEN". Actions (rollback, review
    verdicts, a message to the agent, wake now, a dry run, a replay) are
    POSTs; from the browser they also carry the page's CSRF token, and one
    another origin sent is refused. Wake now, dry run and replay run the
    brainstem command itself (wake --force, wake --dry-run, replay ID) as a
    process, without the dashboard's token. Secret values never reach the browser.
    Nothing is loaded from the internet. A --port that another process holds
    is one line and exit 2 (pick another port); the address is printed only
    once it is listening.

    \b
    Examples:
      brainstem dashboard                                  # prints http://127.0.0.1:8765/?token=...
      brainstem dashboard --agent alice --agent bob
      BRAINSTEM_DASHBOARD_TOKEN=$(openssl rand -hex 24) brainstem dashboard --host 0.0.0.0
      curl -H "Authorization: Bearer $BRAINSTEM_DASHBOARD_TOKEN" http://127.0.0.1:8765/api/karma
    """
    from brainstem.operator.dashboard import auth
    from brainstem.store import open_store

    given = c.settings.dashboard_token.get_secret_value() if c.settings.dashboard_token else None
    token = auth.check_token(given) if given is not None else auth.new_token()
    names = list(dict.fromkeys(agents)) or [c.settings.agent or ""]
    stores = {name: open_store(c.settings.kv, prefix=name or "", register=False) for name in names}
    import uvicorn

    from brainstem.operator.dashboard.app import make_app

    app = make_app(c.settings, stores, token=token, loopback_only=auth.is_loopback(host))
    sock = _listen(host, port)
    port = sock.getsockname()[1]  # the real one when --port 0
    base = f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
    # A token made here is printed once, in the address to open (there is no other way to learn it); the
    # operator's own is not, so that it never lands in a log that did not have it.
    where = (f"{base}?{urlencode({auth.TOKEN_QUERY: token})}" if given is None
             else f"{base} (open it with ?{auth.TOKEN_QUERY}=${auth.TOKEN_ENV})")
    click.echo(f"brainstem dashboard on {where} (agent: {', '.join(n or 'default' for n in names)}); "
               f"Ctrl-C stops it", err=True)
    from brainstem.sandbox import own_ports

    own_ports.register(port)  # defence in depth: the token is what holds (this registry is per HOME)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", proxy_headers=True)
    uvicorn.Server(config).run(sockets=[sock])


def _listen(host: str, port: int):
    """A socket bound to (host, port), handed to uvicorn as it is: a busy port is found here, before the
    URL is printed, and nothing can take the port between the check and the serving."""
    import socket

    from brainstem.core.errors import BadArgument

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise BadArgument(f"--host {host!r} is not an address this machine can listen on ({exc})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart reuses a port left in TIME_WAIT
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise BadArgument(f"cannot listen on {host} port {port}: {exc.strerror or exc}; "
                          f"is another dashboard running? Pick another with --port") from None
    sock.set_inheritable(True)
    return sock
