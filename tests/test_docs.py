"""The README and the pages in docs/ stay true to the code, and their links lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

from brainstem.core.settings import settings_reference

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
CONFIGURATION = (DOCS / "configuration.md").read_text()
RUNNING = (DOCS / "running.md").read_text()
COMMANDS = (DOCS / "commands.md").read_text()


def test_settings_table_matches_the_settings_model():
    table = CONFIGURATION.split("<!-- settings-table:start -->")[1].split("<!-- settings-table:end -->")[0]
    documented = re.findall(r"^\| `([A-Z_]+)` \|", table, flags=re.M)
    assert documented == [name for name, _, _ in settings_reference()]
    for name, default, meaning in settings_reference():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{name}` |"))
        assert meaning in row, name
        if default and name != "BRAINSTEM_KV":
            assert f"`{default}`" in row, name


def test_ci_runs_exactly_the_readme_test_command():
    match = re.search(r"Install with the test extras and run the tests.*?```sh\n(.+?)\n```", README, re.S)
    assert match, "README lost its test command"
    assert match.group(1).strip() in (REPO / ".ci" / "run").read_text()


def test_the_product_cites_nothing_it_does_not_ship():
    """README, code, seeds and benchmarks stand on their own: no pointers to the team's notes."""
    repo = Path(__file__).resolve().parent.parent
    pattern = re.compile(r"DESIGN\.md|\bshared/|seeds/0\d\d_|steering repo|\bissue \d+\b", re.IGNORECASE)
    files = [repo / "README.md", *(p for d in ("brainstem", "bench", "scripts", "tools_seed", "prompts_seed", "docs")
                                  for p in (repo / d).rglob("*")
                                  if p.is_file() and p.suffix in (".py", ".md", ".json"))]
    found = [f"{p.relative_to(repo)}:{n}: {line.strip()}" for p in files
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)


def test_readme_lists_every_outcome_with_whose_move_it_is():
    from brainstem.core import outcomes

    table = RUNNING.split("## Session outcomes")[1].split("\n\n", 2)[2].split("\n\n")[0]
    rows = {m.group(1): line for line in table.splitlines() if (m := re.match(r"^\| `([a-z_]+)` \|", line))}
    assert list(rows) == list(outcomes.ALL)
    for name in outcomes.OPERATOR_FAULTS:
        assert "**operator**" in rows[name], name
    for name in outcomes.ALL:
        counts = rows[name].rstrip(" |").rsplit("|", 1)[1]
        assert ("yes" in counts) == (name in outcomes.FAILING), name


def test_readme_commands_table_names_every_command():
    """Every command and subcommand of the CLI is in the README's command table."""
    import click

    from brainstem.operator.cli import cli

    table = COMMANDS.split("# Commands", 1)[1].split("\n\n", 2)[1]
    names = []
    for name, cmd in cli.commands.items():
        if isinstance(cmd, click.Group):
            names += [f"{name} {sub}" for sub in cmd.commands]
        else:
            names.append(name)
    missing = [n for n in names if not re.search(r"`(brainstem )?" + re.escape(n) + r"\b", table)]
    assert not missing, missing


def test_the_readme_stays_short_and_every_link_leads_somewhere():
    """The README is the first hour; the reference is in docs/. Every relative link, in either, names a
    file that exists and, with #anchor, a heading in it (GitHub's anchors)."""
    assert len(README.splitlines()) <= 300
    pages = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
    assert {p.name for p in pages} >= {"README.md", "running.md", "talking.md", "fleet.md", "security.md",
                                       "tools.md", "commands.md", "configuration.md", "store.md", "development.md"}

    def anchors(path):
        out = set()
        for line in path.read_text().splitlines():
            if m := re.match(r"^#{1,6} (.+)$", line):
                out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
        return out
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\((?!https?:|mailto:)([^)#\s]*)(?:#([\w\-]+))?\)", page.read_text()):
            dest = (page.parent / target).resolve() if target else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target}#{anchor}")
    assert not broken, broken


SECURITY = (DOCS / "security.md").read_text()
# The parts of the security model that state what holds; "What does not hold" states limits, and the
# other sections explain mechanisms (how text is wrapped, how to set up Redis ACLs).
CLAIM_SECTIONS = ("# The security model", "## Behind the interpreter", "## The pool of ready workers",
                  "## Several agents in one store")


def _security_sections():
    """Each section of docs/security.md by its heading line, the first cut at "What does not hold"."""
    parts = re.split(r"^(#{1,2} .+)$", SECURITY, flags=re.M)[1:]
    sections = dict(zip(parts[0::2], parts[1::2], strict=True))
    sections["# The security model"] = sections["# The security model"].split("**What does not hold**")[0]
    return sections


def _bullets(text):
    """Each top-level bullet of a section, continuation lines joined."""
    return re.findall(r"^- .*(?:\n  +\S.*)*", text, flags=re.M)


def test_every_test_the_security_model_cites_exists():
    refs = re.findall(r"`(tests/[^`]*::[^`]*)`", SECURITY)
    assert len(refs) > 20
    wrong = []
    for ref in refs:
        m = re.fullmatch(r"(tests/[\w/]+\.py)::(test_\w+)(\[[^\]]+\])?", ref)
        path = m and REPO / m.group(1)
        if not (m and path.is_file() and re.search(rf"^\s*(async )?def {m.group(2)}\(", path.read_text(), re.M)):
            wrong.append(ref)
    assert not wrong, wrong


def test_every_claim_of_the_security_model_names_its_test():
    """A claim that names no test is one nobody would notice breaking."""
    sections = _security_sections()
    uncited = []
    for heading in CLAIM_SECTIONS:
        title = next((h for h in sections if h.startswith(heading)), None)
        assert title, f"security.md lost its section {heading!r}"
        bullets = _bullets(sections[title])
        assert bullets, title
        uncited += [f"{title}: {b[:70]}" for b in bullets if not re.search(r"`tests/[^`]+::test_\w+", b)]
    assert not uncited, "\n".join(uncited)
