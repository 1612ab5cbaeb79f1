"""``brainstem agents``: the agent names registered in one store, each confined to its own keys."""

from __future__ import annotations

import click

from brainstem.core.errors import BrainstemError
from brainstem.operator.commands.context import Ctx, pass_ctx


@click.group()
def agents() -> None:
    """The agents sharing one store, each confined to its own keys.

    \b
    An agent is named by BRAINSTEM_KV_PREFIX=NAME: (or run --agent NAME) and
    registers its name the first time it uses the store; after that no other
    agent, the default one included, can read, list or write its keys.

    \b
    Examples:
      brainstem agents list
      brainstem agents register bob            # before giving bob its own Redis ACL user
      brainstem agents register bob --adopt    # keys already under bob: are bob's own
    """


@agents.command("list")
@pass_ctx
def agents_list(c: Ctx) -> None:
    """Every registered agent name, one a line (the default agent has none)."""
    from brainstem.store import open_store

    with open_store(c.settings.kv, prefix="") as store:
        for name in sorted(store.registered_agents()):
            click.echo(name)


@agents.command("register")
@click.argument("name")
@click.option("--adopt", is_flag=True,
              help="Accept keys already under NAME: as NAME's own (an agent from before names were registered).")
@pass_ctx
def agents_register(c: Ctx, name: str, adopt: bool) -> None:
    """Register NAME, as opening the store as NAME does on first use."""
    from brainstem.core.names import agent_prefix
    from brainstem.store import open_store

    bare = agent_prefix(name, "agent name")[:-1]
    if not bare:
        raise BrainstemError("the default agent needs no registration; give a NAME")
    with open_store(c.settings.kv, prefix="") as store:
        store.register_agent(bare, adopt=adopt)
        click.echo(f"registered agent {bare} in {store.display_url}")
