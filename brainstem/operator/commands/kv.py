"""The store as the operator sees it: ``brainstem kv`` (get, put, ls, del) and the versions of
self-modified keys (``history``, ``diff``, ``rollback``, ``changes``)."""

from __future__ import annotations

import json

import click

from brainstem.core import keys
from brainstem.core.errors import BadArgument, BrainstemError, MalformedValue, NotFound, NotText
from brainstem.operator.commands.context import Ctx, pass_ctx
from brainstem.operator.output import as_text, echo_lines, json_lines, print_json, table


@click.group()
def kv() -> None:
    """Read and write the store as the operator.

    \b
    The soul is protected here too: changing it needs --force-soul, the
    documented operator override, and is meant for deliberate rewrites.

    \b
    Examples:
      brainstem kv ls config:
      brainstem kv get config:defaults --json
      brainstem kv put wisdom "Be brief."
      brainstem kv put prompt:orient --file orient.md
    """


@kv.command("get")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Parse the value as JSON and pretty-print it.")
@pass_ctx
def kv_get(c: Ctx, key: str, as_json: bool) -> None:
    """Print the value of KEY (raw text by default)."""
    value = c.store.get(key)
    if value is None:
        if c.store.log_length(key):
            raise BadArgument(f"{key!r} is a log, not a value; read it with `brainstem karma`")
        raise NotFound(f"no key {key!r} in {c.store.display_url}; `brainstem kv ls` lists them")
    if as_json:
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise MalformedValue(f"value of {key!r} is not valid JSON ({exc}); drop --json to see it raw") from None
        print_json(parsed, indent=2)
    else:
        click.echo(value, nl=not value.endswith("\n"))


@kv.command("put")
@click.argument("key")
@click.argument("value", required=False)
@click.option("--file", "file_", type=click.File("r"), help="Read the value from a file ('-' for stdin).")
@click.option("--json", "as_json", is_flag=True, help="Require the value to be valid JSON (stored compact).")
@click.option("--force-soul", is_flag=True, help="Operator override: allow replacing the soul.")
@click.option("--force", is_flag=True,
              help="Store a config:* or prompt:* value that fails its check anyway (config:reflexes excepted: "
                   "it is rules or nothing).")
@pass_ctx
def kv_put(c: Ctx, key: str, value: str | None, file_, as_json: bool, force_soul: bool, force: bool) -> None:
    """Set KEY to VALUE (or the contents of --file).

    A config:*, prompt:* or schedule:* value is checked before it is written:
    config:defaults and config:models against their schemas, config:resources
    and config:tool_registry for their shape, config:reflexes as rules, any
    other config:* as JSON; a prompt:* must be a template the renderer fills
    (every {{ a placeholder such as {{context.now}}, no {{soul}}); a
    schedule:ID must be a schedule (docs/schedules.md). A bad value is exit 2
    with one line naming the key and the field, and nothing is written.

    \b
    Examples:
      brainstem kv put wisdom "Be brief."
      brainstem kv put config:defaults --file defaults.json
      brainstem kv put config:defaults --json '{"orient": {"max_output_tokens": 4000}}'
      brainstem kv put prompt:orient --file orient.md --force   # store it despite the check
      brainstem kv get schedule:a1b2c3d4 > s.json   # edit it (e.g. next_run), then:
      brainstem kv put schedule:a1b2c3d4 --file s.json
    """
    from brainstem.state.checks import check_value as problem_with
    from brainstem.state.guarded import check_key

    if (value is None) == (file_ is None):
        raise click.UsageError("give exactly one of VALUE or --file")
    text = file_.read() if file_ is not None else value
    check_key(key)
    if key == keys.SOUL and not force_soul:
        raise BrainstemError("soul is immutable; to replace it deliberately, add --force-soul")
    if as_json:
        try:
            text = json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
        except ValueError as exc:
            raise MalformedValue(f"value for {key!r} is not valid JSON: {exc}") from None
    problem = problem_with(key, text)
    if problem is not None and (not force or key == keys.CONFIG_REFLEXES):
        tail = ("config:reflexes is rules or nothing, even with --force" if key == keys.CONFIG_REFLEXES
                else "--force stores it anyway")
        raise BadArgument(f"{problem} (nothing written; {tail})")
    from brainstem.state.versions import record_write

    old = _previous(c.store, key)
    if keys.is_secret(key):
        from brainstem.state import secret_marks

        secret_marks.forget(c.store, key)  # the value is the operator's now, whatever the agent wrote before
    c.store.put(key, text)
    version = record_write(c.store, key, old, text, source="operator")
    click.echo(f"put {key} ({len(text.encode())} bytes)" + (f", version {version}" if version else ""))
    if keys.code_name(key) is not None:  # code the operator puts is code the operator approves
        from brainstem.state import approval

        rec = approval.approve(c.store, keys.code_name(key), text, by="operator:kv put")
        click.echo(f"approved {key} (sha256 {rec['sha256'][:12]})")
    if problem is not None:
        click.echo(f"stored despite its check (--force): {problem}", err=True)
    elif key.startswith(keys.SCHEDULE_PREFIX) and "created_by" not in json.loads(text):
        click.echo(f'note: {key} has no created_by, so it counts as the agent\'s (which may change or remove it); '
                   f'add "created_by": "operator" to keep it yours', err=True)


def _previous(store, key: str) -> str | None:
    """The value an operator write replaces, for its version history; a value that is not text
    (the reason for the write, often) is replaced without being recorded."""
    try:
        return store.get(key)
    except NotText:
        return None


@kv.command("ls")
@click.argument("prefix", default="")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True, help="At most this many keys.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per key.")
@pass_ctx
def kv_ls(c: Ctx, prefix: str, limit: int, as_json: bool) -> None:
    """List keys starting with PREFIX (all keys by default)."""
    for k in c.store.list_all(prefix, limit=limit):
        if as_json:
            click.echo(json.dumps({"name": k.name, "metadata": k.metadata, "expiration": k.expiration,
                                   "log": k.is_log}))
        else:
            click.echo(f"{k.name}  (log)" if k.is_log else k.name)


@kv.command("del")
@click.argument("key")
@click.option("--force-soul", is_flag=True, help="Operator override: allow deleting the soul.")
@pass_ctx
def kv_del(c: Ctx, key: str, force_soul: bool) -> None:
    """Delete KEY (a value or a log)."""
    if key == keys.SOUL and not force_soul:
        raise BrainstemError("soul is immutable; to delete it deliberately, add --force-soul")
    from brainstem.state.versions import record_write

    old = _previous(c.store, key)
    if keys.is_secret(key):
        from brainstem.state import secret_marks

        secret_marks.forget(c.store, key)
    if c.store.delete(key) or c.store.delete_log(key):
        record_write(c.store, key, old, None, source="operator")
        click.echo(f"deleted {key}")
    else:
        raise NotFound(f"no key {key!r} in {c.store.display_url}; `brainstem kv ls` lists them")


# --- versions -------------------------------------------------------------

@click.command()
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per version, values included.")
@pass_ctx
def history(c: Ctx, key: str, as_json: bool) -> None:
    """List the recorded versions of a self-modified KEY (prompt:*, config:*, tool:*, provider:*, wisdom).

    A version is recorded at every change, by the agent or the operator; the
    value a key had before its first change is kept as version 1.

    \b
    Examples:
      brainstem history prompt:orient
      brainstem diff prompt:orient          # previous version -> current
      brainstem rollback prompt:orient      # restore the previous version
      brainstem changes --since 1d          # every change to any key
    """
    from brainstem.state.versions import no_versions_message, versions

    vs = versions(c.store, key)
    if not vs:
        if not keys.is_privileged(key):
            raise BadArgument(no_versions_message(key))
        if not as_json:
            click.echo(no_versions_message(key))
        return
    current = c.store.get(key)
    # A rollback records the restored value as a new version, so an older version can hold the same value
    # as the current one: mark only the newest version that holds it, the one the key is at now.
    marked = next((v["version"] for v in reversed(vs) if v.get("value") == current), None)
    rows = []
    for v in vs:
        if as_json:
            print_json(v)
            continue
        value = v.get("value")
        first = "(deleted)" if value is None else (value.strip().splitlines() or [""])[0][:60]
        rows.append(["*" if v["version"] == marked else " ", f"v{v['version']}", v.get("at") or "before history",
                     as_text(v.get("source"), ""), as_text(v.get("session_id")),
                     f"{0 if value is None else len(value)}B", first])
    echo_lines(table(rows, right=(5,)))


@click.command()
@click.argument("key")
@click.argument("version", type=int, required=False)
@pass_ctx
def diff(c: Ctx, key: str, version: int | None) -> None:
    """Show what changed in KEY since VERSION (default: the previous version), as a unified diff.

    \b
    Examples:
      brainstem diff prompt:orient          # the last change
      brainstem diff config:defaults 1      # everything since the seeded original
      brainstem history config:defaults     # the version numbers
    """
    from brainstem.state.versions import diff as version_diff

    text = version_diff(c.store, key, version)
    click.echo(text if text else f"{key}: no difference")


@click.command()
@click.argument("key")
@click.option("--to", "version", type=int, help="The version to restore (default: the previous one).")
@pass_ctx
def rollback(c: Ctx, key: str, version: int | None) -> None:
    """Restore KEY to an earlier version. The restore is recorded as a new version, so it can be undone too.

    \b
    Examples:
      brainstem rollback prompt:orient          # undo the last change
      brainstem rollback config:models --to 1   # back to the seeded original
      brainstem rollback prompt:orient          # again: undoes the rollback
    """
    from brainstem.state.versions import rollback as do_rollback

    if key == keys.SOUL:
        raise BrainstemError("soul is not versioned; set it deliberately with `kv put soul --force-soul`")
    out = do_rollback(c.store, key, version)
    click.echo(f"{key}: restored version {out['restored_version']} (now version {out['new_version']})")


@click.command()
@click.option("--since", "since_text", metavar="WHEN",
              help="Only changes made since WHEN: a duration back from now (30m, 12h, 7d, 2w) or a UTC date or "
                   "time (2026-05-01).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per change.")
@pass_ctx
def changes(c: Ctx, since_text: str | None, as_json: bool) -> None:
    """Every recorded change to a versioned key, across keys, newest last.

    Each line: when, the key, its new version, who wrote it (the session's id,
    operator, or runtime) and the path it came through (reflect, deep_reflect,
    tool:NAME, operator, operator:rollback, seed --force, runtime:auto_restore).

    \b
    Examples:
      brainstem changes --since 7d
      brainstem changes --json | jq -r 'select(.who != "operator") | .key'
      brainstem diff prompt:orient           # then look at one of them
    """
    from brainstem.core.clock import iso
    from brainstem.state.history import parse_since
    from brainstem.state.versions import changes as all_changes

    cutoff = parse_since(since_text) if since_text else None
    found = all_changes(c.store, cutoff)
    if as_json:
        json_lines(found)
        return
    if not found:
        click.echo("no changes recorded" + (f" since {iso(cutoff)}" if cutoff else " yet"))
        return
    rows = [[ch["at"], ch["key"], f"v{ch['version']}", ch["who"], as_text(ch["source"], ""),
             "(deleted)" if ch["deleted"] else f"{ch['bytes']}B"] for ch in found]
    echo_lines(table(rows, right=(5,), header=["TIME", "KEY", "VERSION", "WHO", "PATH", "SIZE"]))
