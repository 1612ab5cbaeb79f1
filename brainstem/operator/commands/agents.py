"""``brainstem agents``: the agent names registered in one store, each confined to its own keys."""

from __future__ import annotations

import click

from brainstem.core.errors import BadArgument, BrainstemError, NotFound
from brainstem.operator.commands.context import Ctx, pass_ctx


@click.group()
def agents() -> None:
    """The agents sharing one store, each confined to its own keys.

    \b
    An agent is named by BRAINSTEM_KV_PREFIX=NAME: (or run --agent NAME). It
    exists once `brainstem seed` (or `agents register`) has registered its
    name; every other command refuses a name that is not registered (exit 2),
    so a typo never becomes an agent. No other agent, the default one
    included, can read, list or write a registered agent's keys.

    \b
    Examples:
      BRAINSTEM_KV_PREFIX=bob brainstem seed --soul bob.md   # registers bob
      brainstem agents list                    # (default), then every name
      brainstem agents register bob            # before giving bob its own Redis ACL user
      brainstem agents register bob --adopt    # keys already under bob: are bob's own
      brainstem agents rm bob                  # only once bob holds no keys
    """


@agents.command("list")
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object per agent: {"name": null, "prefix": ""} for the default agent, then '
                   '{"name": "bob", "prefix": "bob:"}.')
@pass_ctx
def agents_list(c: Ctx, as_json: bool) -> None:
    """The agents in the store, one a line: "(default)" (the agent with no prefix, always there), then
    every registered name, sorted.

    \b
    Examples:
      brainstem agents list
      brainstem agents list --json | jq -r 'select(.name) | .name'
    """
    import json

    from brainstem.store import open_store

    with open_store(c.settings.kv, prefix="") as store:
        found = sorted(store.registered_agents())
    for name in [None, *found]:
        if as_json:
            click.echo(json.dumps({"name": name, "prefix": f"{name}:" if name else ""}))
        else:
            click.echo(name or "(default)")


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


@agents.command("rm")
@click.argument("name")
@pass_ctx
def agents_rm(c: Ctx, name: str) -> None:
    """Remove NAME's registration, once NAME holds no keys.

    Nothing is deleted: an agent that still holds keys (its soul, config,
    karma, a wake lease...) keeps its registration, and the command says how
    many and how to delete them first (exit 2). Keys under a name that is not
    registered would be the default agent's to read and write, so a
    registration never goes while anything is left under it.

    \b
    Examples:
      brainstem agents rm bobb                              # a name registered by mistake
      BRAINSTEM_KV_PREFIX=bob brainstem kv ls               # what bob still holds
      BRAINSTEM_KV_PREFIX=bob brainstem kv del KEY          # delete them one by one, then rm
    """
    from brainstem.core.names import agent_prefix
    from brainstem.store import open_store

    bare = agent_prefix(name, "agent name")[:-1]
    if not bare:
        raise BadArgument("the default agent has no registration to remove; give a NAME")
    with open_store(c.settings.kv, prefix="") as store:
        held = store.unregister_agent(bare)
        if held is None:
            raise NotFound(f"no agent {bare!r} is registered in {store.display_url} (`brainstem agents list` "
                           f"names them)")
        if held:
            raise BadArgument(f"agent {bare!r} still holds {held} key{'s' if held != 1 else ''} in "
                              f"{store.display_url}; nothing removed: delete them first "
                              f"(`BRAINSTEM_KV_PREFIX={bare} brainstem kv ls`, then `kv del KEY`), or keep the "
                              f"registration")
        click.echo(f"removed agent {bare} from {store.display_url} (it held no keys)")
