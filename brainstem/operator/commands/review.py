"""``brainstem review``: the operator settles the runs of supervised tools (see :mod:`brainstem.state.review`)."""

from __future__ import annotations

import json

import click

from brainstem.core.errors import BadArgument, one_line
from brainstem.operator.output import as_text, echo_lines, json_lines, print_json, row, short_time, table

PREVIEW = 50  # characters of a list row's input preview


def _preview(value, limit: int) -> str:
    return one_line(as_text(value, "null"), limit)


def _outcome(item: dict) -> str:
    return "ok" if item.get("ok") is True else f"error: {_preview(item.get('error') or 'unknown', 40)}"


def _list(items: list[dict], include_settled: bool, settled_too: int) -> None:
    if not items:
        if include_settled:
            click.echo("no tool runs recorded for review (tools in supervised mode land here when they run)")
            return
        click.echo("no tool runs waiting for review")
        if settled_too:
            click.echo(f"({settled_too} settled: `brainstem review --all` lists them)")
        else:
            click.echo("(each run of a tool in supervised mode lands here; `brainstem tool ls` shows the modes)")
        return
    rows = [[item["id"], short_time(item.get("created_at")), _preview(item.get("tool"), 40),
             _preview(item.get("session_id"), 30), _preview(item.get("status"), 20), _outcome(item),
             _preview(item.get("input"), PREVIEW)] for item in items]
    echo_lines(table(rows, right=(0,), header=["ID", "CREATED", "TOOL", "SESSION", "STATUS", "OK/ERROR", "INPUT"]))


def _value_rows(label: str, value) -> None:
    """A JSON value on one row when short, else pretty-printed under its label."""
    text = as_text(value, "null")
    if len(text) <= 80 and "\n" not in text:
        row(label, text)
        return
    click.echo(label)
    pretty = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, default=str)
    for line in pretty.splitlines():
        click.echo(f"  {line}")


def _show(item: dict) -> None:
    row("review item", item["id"])
    row("tool", as_text(item.get("tool")))
    row("status", as_text(item.get("status")) + (f" at {as_text(item.get('settled_at'))}"
                                                  if item.get("settled_at") else ""))
    row("created", as_text(item.get("created_at")))
    row("session", as_text(item.get("session_id")) + (f" (step {as_text(item.get('step_id'))})"
                                                      if item.get("step_id") else ""))
    row("ran", "ok" if item.get("ok") is True else "failed")
    if item.get("error"):
        _value_rows("error", item.get("error"))
    _value_rows("input", item.get("input"))
    _value_rows("result", item.get("result"))
    if item.get("correction") is not None:
        _value_rows("correction", item.get("correction"))
    if item.get("status") == "pending":
        click.echo(f"settle it: brainstem review {item['id']} --confirm   (or --correct TEXT)")


@click.command()
@click.argument("item_id", metavar="[ID]", required=False)
@click.option("--confirm", is_flag=True, help="Settle item ID: the run was right.")
@click.option("--correct", "correction", metavar="TEXT",
              help="Settle item ID: the run was wrong, and TEXT says what it should have done.")
@click.option("--all", "include_settled", is_flag=True, help="List settled items too, with their verdict.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per item (with its id); with ID, that item's object.")
@click.pass_obj
def review(c, item_id: str | None, confirm: bool, correction: str | None, include_settled: bool,
           as_json: bool) -> None:
    """The review inbox: runs of supervised tools, waiting for your verdict.

    Each tool's meta has a mode: manual tools never run (a session records
    what they would have done), supervised tools run and each run lands
    here, automated tools run unwatched. Settle each run with --confirm (it
    was right) or --correct TEXT (what it should have done). Deep reflection
    sees each tool's record (confirmed, corrected, pending, the last
    corrections), so the agent can promote a tool or demote it on evidence.
    The agent itself can never settle its own runs.

    Without ID: the pending items (--all: every item). With ID: that item in
    full; with --confirm or --correct, settle it.

    \b
    Examples:
      brainstem review                      # what waits for a verdict
      brainstem review 3                    # one run: input, result, error
      brainstem review 3 --confirm
      brainstem review 4 --correct "send it to the ops channel, not to everyone"
      brainstem review --all --json | jq -r 'select(.status == "corrected") | .tool'
    """
    from brainstem.state import review as inbox

    if confirm and correction is not None:
        raise BadArgument("give --confirm or --correct TEXT, not both")
    settling = confirm or correction is not None
    if item_id is None:
        if settling:
            flag = "--confirm" if confirm else "--correct TEXT"
            raise BadArgument(f"{flag} needs the ID of the item to settle, e.g. `brainstem review 3 {flag}`; "
                              f"`brainstem review` lists the pending ones")
        found = inbox.items(c.store, include_settled=include_settled)
        if as_json:
            json_lines(found)
            return
        settled_too = 0 if include_settled or found else len(inbox.items(c.store, include_settled=True))
        _list(found, include_settled, settled_too)
        return
    if include_settled:
        raise BadArgument("--all lists every item and takes no ID; `brainstem review ID` shows one item, "
                          "settled or not")
    if settling:
        item = inbox.settle(c.store, item_id, confirm=confirm, correction=correction)
        if as_json:
            print_json(item)
            return
        click.echo(f"review item {item['id']} ({_preview(item.get('tool'), 60)}) {item['status']}")
        return
    item = inbox.get(c.store, item_id)
    if item is None:
        raise inbox.not_found(item_id)
    if as_json:
        print_json(item)
        return
    _show(item)
