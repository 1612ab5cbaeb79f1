"""``brainstem seed``: the shipped prompts, config, tools (and a soul) written into the store."""

from __future__ import annotations

from pathlib import Path

import click

from brainstem.operator.commands.context import Ctx, pass_ctx


@click.command()
@click.option("--soul", "soul_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Set the soul from this file when the store has none (an existing soul is never replaced).")
@click.option("--example-soul", is_flag=True, help="Use the shipped example soul when the store has none.")
@click.option("--force", is_flag=True, help="Rewrite seeded keys even if present (the soul is still never replaced).")
@click.option("--with-providers", is_flag=True,
              help="Also write the editable tier-1 LLM adapter and balance checkers (provider:*). They need "
                   "BRAINSTEM_LLM_API_KEY in BRAINSTEM_TOOL_SECRETS (bound to the LLM endpoint's host) to work; "
                   "without it the hard-coded client answers.")
@pass_ctx
def seed(c: Ctx, soul_file: Path | None, example_soul: bool, force: bool, with_providers: bool) -> None:
    """Write the shipped prompts, config and tools into the store.

    Idempotent: keys already present are kept (the agent may have improved
    them), unless --force. The soul is set only when absent.

    \b
    Examples:
      brainstem seed --example-soul
      brainstem seed --soul my_soul.md
      brainstem seed --force            # put the shipped prompts, config and tools back
    """
    from brainstem.state.seed import example_soul_path, read_soul_file
    from brainstem.state.seed import seed as do_seed

    if soul_file and example_soul:
        raise click.UsageError("give --soul FILE or --example-soul, not both")
    soul = example_soul_path() if example_soul else soul_file
    if soul is not None:
        read_soul_file(soul)  # a wrong path fails here, before the store is even opened
    report = do_seed(c.store, soul_file=soul, force=force, with_providers=with_providers)
    counts = [f"{len(report.written)} written"]
    if report.unchanged:
        counts.append(f"{len(report.unchanged)} unchanged (already the shipped value)")
    if report.kept or not force:
        counts.append(f"{len(report.kept)} already present (kept; --force rewrites them)")
    click.echo(f"seeded {c.store.display_url}: {', '.join(counts)}")
    if report.soul == "set":
        click.echo("soul: set")
    elif report.soul == "kept":
        click.echo("soul: present (kept; the soul is never overwritten)")
    else:
        click.echo("soul: not set yet; run `brainstem seed --soul FILE` (or --example-soul) before the first wake")
