"""``brainstem dashboard``: what the agent did, spent and changed, in a browser."""

from __future__ import annotations

import click


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback needs BRAINSTEM_DASHBOARD_TOKEN.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Port to listen on.")
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
    stores = {name: open_store(c.settings.kv, prefix=name or "") for name in names}
    import uvicorn

    from brainstem.operator.dashboard.app import make_app

    app = make_app(c.settings, stores, token=token, loopback_only=auth.is_loopback(host))
    click.echo(f"brainstem dashboard on http://{'[' + host + ']' if ':' in host else host}:{port} "
               f"(agent: {', '.join(n or 'default' for n in names)}); Ctrl-C stops it", err=True)
    from brainstem.sandbox import own_ports

    own_ports.register(port)  # tools in this host's runtime never fetch it
    uvicorn.run(app, host=host, port=port, log_level="warning", proxy_headers=True)
