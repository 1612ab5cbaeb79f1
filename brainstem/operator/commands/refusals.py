"""``brainstem refusals``: stops of sandboxed code for secret text, and the hold they put on the agent's code."""

from __future__ import annotations

import click

from brainstem.operator.output import print_json


@click.command()
@click.option("--clear", "clear_hold", is_flag=True,
              help="Lift the hold, so the agent's code runs again (after you have read the karma of the stop).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_obj
def refusals(c, clear_hold: bool, as_json: bool) -> None:
    """Show how often the agent's code was stopped for secret text, and lift the hold that follows.

    Code in the sandbox only ever holds placeholders, so a secret's value (or
    8 characters of one) in what it sends, or in what it arranged to be handed
    back, came from a leak or a guess. The runtime stops that code at once
    (a `secret_refused` entry in the session's karma) and holds ALL of the
    agent's code: tools, its LLM adapter and balance checkers do not run (the
    hard-coded client and checkers answer) until you clear the hold. That way
    a guessing agent learns whether one guess was right per look of yours,
    not one per session.

    \b
    Examples:
      brainstem refusals                 # counts, the last stop, whether code is held
      brainstem karma SESSION            # what the stopped code did (look for secret_refused)
      brainstem refusals --clear         # let the agent's code run again
    """
    from brainstem.state import refusals as record

    if clear_hold:
        lifted = record.clear(c.store)
        click.echo("hold lifted: the agent's code runs again" if lifted else "no hold to lift")
        return
    counts = record.counts(c.store)
    if as_json:
        print_json(counts, sort_keys=True)
        return
    click.echo(f"secret_refused stops: {counts['total']} in all, {counts['today']} today")
    if counts["last_tool"]:
        click.echo(f"last: {counts['last_tool']} at {counts['last_at']}")
    click.echo("the agent's code is HELD: clear with brainstem refusals --clear" if counts["held"]
               else "the agent's code is not held")
