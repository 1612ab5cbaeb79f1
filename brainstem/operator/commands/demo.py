"""``brainstem demo``: a whole session, offline and with no API key, on a throwaway store."""

from __future__ import annotations

from pathlib import Path

import click

from brainstem.core.errors import BrainstemError


@click.command()
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the demo's store in this directory (default: a temporary one, deleted at the end).")
def demo(keep: Path | None) -> None:
    """Run a whole session offline, with no API key, against recorded LLM answers.

    Seeds a fresh agent on a throwaway embedded store, runs one session
    (orient, an action, a think, a conditional, reflect) through the real
    runtime, chokepoint, sandbox and karma, with the model's answers played
    back from a cassette shipped in the package, then prints the flight
    recorder and where to go next. The throwaway store is deleted when the
    demo ends; --keep DIR keeps it there to look around in.

    \b
    Examples:
      brainstem demo
      brainstem demo --keep ./demo
      BRAINSTEM_KV=sqlite:///demo/demo.db brainstem sessions   # three slashes: relative
    """
    from brainstem.operator.demo import run_demo

    code = run_demo(click.echo, keep=keep)
    if code:
        raise BrainstemError("the demo session did not end clean; see its karma above")
