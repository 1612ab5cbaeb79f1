"""``brainstem dashboard``: what the agent did, spent and changed, in a browser."""

from __future__ import annotations

import click


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback needs BRAINSTEM_DASHBOARD_TOKEN.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to listen on (0: any free one). A port already in use is exit 2, before anything is served.")
@click.option("--agent", "agents", multiple=True,
              help="Show this agent (keys under NAME:); repeat for several, switched between in the page. "
                   "Default: the store's agent (BRAINSTEM_KV_PREFIX).")
@click.pass_obj
def dashboard(c, host: str, port: int, agents: tuple[str, ...]) -> None:
    """Serve the dashboard: status, sessions, timelines, live karma, self-modification, the store, review.

    Read-only views for anyone who can reach it; actions (rollback, review
    verdicts, a message to the agent) are CSRF-checked POSTs, and need the
    token when one is set. On loopback (the default) no token is needed; any
    other --host refuses to start without BRAINSTEM_DASHBOARD_TOKEN. Secret
    values never reach the browser. Nothing is loaded from the internet.
    A --port that another process holds is one line and exit 2 (pick
    another port); the address is printed only once it is listening.

    \b
    Examples:
      brainstem dashboard                                  # http://127.0.0.1:8765
      brainstem dashboard --agent alice --agent bob
      BRAINSTEM_DASHBOARD_TOKEN=$(openssl rand -hex 24) brainstem dashboard --host 0.0.0.0
    """
    from brainstem.operator.dashboard import auth
    from brainstem.store import open_store

    token = c.settings.dashboard_token.get_secret_value() if c.settings.dashboard_token else None
    auth.check_bind(host, token)
    names = list(dict.fromkeys(agents)) or [c.settings.agent.rstrip(":")]
    stores = {name: open_store(c.settings.kv, prefix=name or "", register=False) for name in names}
    import uvicorn

    from brainstem.operator.dashboard.app import make_app

    app = make_app(c.settings, stores, token=token, loopback_only=auth.is_loopback(host))
    sock = _listen(host, port)
    port = sock.getsockname()[1]  # the real one when --port 0
    click.echo(f"brainstem dashboard on http://{'[' + host + ']' if ':' in host else host}:{port} "
               f"(agent: {', '.join(n or 'default' for n in names)}); Ctrl-C stops it", err=True)
    from brainstem.sandbox import own_ports

    own_ports.register(port)  # tools in this host's runtime never fetch it
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
