"""``brainstem status`` (where the agent stands, gathered and rendered by :mod:`brainstem.operator.status`)
and ``brainstem anomaly``, the one correction status offers."""

from __future__ import annotations

import click

from brainstem.core.errors import BadArgument
from brainstem.operator import output
from brainstem.operator.commands.context import Ctx, pass_ctx


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_ctx
def status(c: Ctx, as_json: bool) -> None:
    """Where the agent stands: last session, spend today, balances, next wake, crashes in a row.

    Also: a session running now (or one that died), what the operator must do
    after a fault, cost anomalies, unread messages for the agent (and
    whether one is urgent), secret bindings and the sandbox's protections.

    \b
    Examples:
      brainstem status
      brainstem status --json | jq .cost_today
      brainstem sessions --since 1d          # then what ran today
    """
    from brainstem.operator.status import render
    from brainstem.operator.status import status as get_status

    report = get_status(c.store, c.settings)
    if as_json:
        output.print_json(report, indent=2)
    else:
        output.echo_lines(render(report))


@click.command()
@click.argument("number", type=click.IntRange(min=1))
@click.option("--billed", type=click.FloatRange(min=0), required=True,
              help="What the provider actually billed for that call, in USD (0 when it was not billed).")
@pass_ctx
def anomaly(c: Ctx, number: int, billed: float) -> None:
    """Correct today's spend for one cost anomaly that `brainstem status` lists.

    A call whose reported cost is above the most it could cost is charged as
    reported (that is what the provider says it billed) and listed by status as
    COST ANOMALY N. When the provider's activity page shows it billed less, this
    takes the difference off today's spend, for that call alone.

    \b
    Examples:
      brainstem status                       # COST ANOMALY 1 ... reported $180.0000 ...
      brainstem anomaly 1 --billed 0.0021    # what the activity page shows
    """
    from brainstem.state.budget import correct_anomaly

    try:
        item, total = correct_anomaly(c.store, number, billed)
    except ValueError as exc:
        # An unknown number, a correction already made, --billed out of range: each a wrong argument (exit 2).
        raise BadArgument(str(exc)) from None
    click.echo(f"cost anomaly {number} ({item.get('model')}, reported ${item.get('reported', 0):.4f}) corrected "
               f"to ${billed:.4f}; today's spend is now ${total:.4f}")
