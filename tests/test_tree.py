"""The tests mirror the package: ``brainstem/LAYER/.../MODULE.py`` is tested in ``tests/LAYER/.../test_MODULE.py``.

A package whose ``__init__.py`` defines a function or a class is tested in its own folder under its own name
(``brainstem/store/__init__.py`` in ``tests/store/test_store.py``); one that only names its modules needs nothing.
A module with no test file of its own has an entry in :data:`ELSEWHERE` saying where its behaviour is tested
and why not in a file of its own; the test files an entry names must exist.

Beside the mirror: ``tests/e2e/`` holds whole-product journeys, ``tests/hostile/`` attack suites,
``tests/doubles/`` the loopback servers that stand in for the outside world; at the top of ``tests/`` are the
helpers and the tests of the repository itself (:data:`REPOSITORY_TESTS`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import brainstem
from tests.helpers import REPO

PACKAGE = REPO / "brainstem"
TESTS = REPO / "tests"
BESIDE_THE_MIRROR = ("e2e", "hostile", "doubles")
REPOSITORY_TESTS = ("test_cli_inprocess.py", "test_deploy_files.py", "test_docs.py", "test_layers.py", "test_tree.py")

# Modules without a test file of their own: where each one's behaviour is tested, and why not in its own file.
ELSEWHERE: dict[str, str] = {
    "brainstem/tools/mcp_launch.py": "the keeper a stdio MCP server runs under, as a process of its own: "
                                     "tests/tools/test_mcp_client.py and tests/hostile/test_mcp_attacks.py run "
                                     "real servers under it",
    "brainstem/session/replay_mcp.py": "a replay's MCP servers: tests/e2e/test_mcp.py replays a session whose "
                                       "agent step called two MCP tools side by side (same behaviour)",
    "brainstem/tools/fetch_guard.py": "between ctx.fetch and the wire: tests/tools/test_services.py (secrets bound "
                                      "to hosts, echoes, metering) and tests/hostile/",
    "brainstem/__main__.py": "the console script's entry; tests/e2e/test_wake.py runs the sleep path through it "
                             "(and checks what it imports), tests/test_cli_inprocess.py every other command",
    "brainstem/core/environment.py": "the light half of the settings, for the sleep path: tests/core/test_settings.py "
                                     "(the environment read in one place) and tests/e2e/test_wake.py",
    "brainstem/core/errors.py": "exception classes and their exit codes: tests/operator/test_cli.py runs every "
                                "documented exit code, and each layer's tests expect the errors it raises",
    "brainstem/core/events.py": "karma's event names, constants only: every test that reads karma reads them, "
                                "e.g. tests/e2e/test_wake.py and tests/store/test_karma.py",
    "brainstem/core/keys.py": "key names, and which keys the runtime owns: tests/state/test_guarded.py "
                              "(runtime-owned keys refused) and tests/hostile/test_limits_invariants.py",
    "brainstem/core/plan.py": "the plan format and its parser: tests/session/test_executor.py (parse_plan, steps) "
                              "and tests/e2e/test_wake.py (bad orient answers)",
    "brainstem/core/templates.py": "rendering and substitution: tests/session/test_executor.py (render, substitute, "
                                   "references) and tests/hostile/test_untrusted_prompts.py (render with provenance)",
    "brainstem/core/timeline.py": "karma as lines a person reads: each wake's progress in tests/e2e/test_wake.py, "
                                  "`brainstem karma` and its --follow in tests/operator/commands/test_karma.py",
    "brainstem/core/untrusted.py": "marking and wrapping untrusted text: tests/hostile/test_untrusted_prompts.py, "
                                   "an attack suite over every path into a prompt",
    "brainstem/core/wire.py": "one deadline for a whole HTTP exchange: tests/e2e/test_faults.py (a dripping endpoint "
                              "cannot hold the wake) and tests/sandbox/test_fetch.py",
    "brainstem/session/deep_schedule.py": "when deep reflection comes and how a failing one recovers: "
                                          "tests/hostile/test_deep_reflection.py (the bounds as properties, a "
                                          "broken prompt put back) and tests/e2e/test_reflection.py",
    "brainstem/operator/mcp_view.py": "the MCP server `brainstem mcp` serves: tests/operator/commands/test_mcp.py "
                                      "drives the command with the SDK's stdio client",
    "brainstem/state/secret_marks.py": "which secret values the agent wrote: tests/hostile/test_agent_secrets.py, "
                                       "a property over the dashboard, tool grants and every way the agent writes",
    "brainstem/llm/cassette.py": "recorded answers through the chokepoint: tests/e2e/test_offline_loop.py, "
                                 "tests/session/test_wake.py and tests/operator/commands/test_wake.py",
    "brainstem/llm/chokepoint.py": "the one way to call a model: tests/session/test_executor.py (prices, max_tokens, "
                                   "providers in order) and every wake in tests/e2e/test_wake.py",
    "brainstem/llm/messages.py": "chat messages and native tool calls: tests/tools/test_schema.py (parsing tool "
                                 "calls) and tests/session/test_agent_step.py",
    "brainstem/llm/providers.py": "the Provider protocol and the built-in provider over the OpenRouter client: "
                                  "tests/llm/test_openrouter.py (the client), tests/tools/test_adapters.py (the "
                                  "cascade) and every wake in tests/e2e/test_wake.py",
    "brainstem/operator/commands/dashboard.py": "`brainstem dashboard`: tests/e2e/test_dashboard.py starts it, "
                                                "tests/hostile/test_dashboard_token.py its token, "
                                                "tests/operator/test_output.py a busy port",
    "brainstem/operator/commands/demo.py": "`brainstem demo`: tests/operator/commands/test_wake.py and "
                                           "tests/operator/commands/test_karma.py run it offline",
    "brainstem/operator/commands/inbox.py": "`brainstem tell` and `brainstem inbox`: tests/state/test_inbox.py, "
                                            "with the inbox on every surface",
    "brainstem/operator/commands/kv.py": "`brainstem kv`, history, diff, rollback, changes: "
                                         "tests/operator/commands/test_context.py, tests/state/test_checks.py, "
                                         "tests/operator/test_output.py and tests/operator/commands/test_karma.py",
    "brainstem/operator/commands/refusals.py": "`brainstem refusals`: tests/operator/commands/test_karma.py (its "
                                               "JSON says whether the code is held); the hold itself in "
                                               "tests/state/test_refusals.py",
    "brainstem/operator/commands/replay.py": "`brainstem replay`: tests/session/test_replay.py runs it end to end",
    "brainstem/operator/commands/review.py": "`brainstem review`: tests/state/test_review.py settles items through it",
    "brainstem/operator/commands/seed.py": "`brainstem seed`: tests/operator/commands/test_context.py, "
                                           "tests/operator/commands/test_karma.py (the soul file checked first) "
                                           "and tests/state/test_approval.py (seeding approves shipped code)",
    "brainstem/operator/dashboard/app.py": "the dashboard's routes: tests/operator/dashboard/test_auth.py, "
                                           "tests/operator/dashboard/test_views.py (the schedules page), "
                                           "tests/hostile/test_dashboard_token.py (every route) and "
                                           "tests/hostile/test_dashboard.py",
    "brainstem/operator/demo/__init__.py": "the demo's session on a throwaway store: tests/e2e/test_offline_loop.py "
                                           "and tests/operator/commands/test_wake.py",
    "brainstem/operator/progress.py": "live progress of a wake: tests/operator/commands/test_wake.py (--quiet, "
                                      "--log-format, the tty display)",
    "brainstem/operator/status.py": "`brainstem status` gathered and rendered: tests/operator/commands/test_status.py, "
                                    "tests/operator/commands/test_wake.py, tests/operator/commands/test_karma.py "
                                    "and tests/e2e/test_lifecycle_faults.py",
    "brainstem/sandbox/__init__.py": "the sandbox's names, re-exported lazily: every test in "
                                     "tests/sandbox/test_runner.py enters through them",
    "brainstem/sandbox/compiled.py": "compiled code kept for a tool's next call: tests/sandbox/test_pool.py",
    "brainstem/sandbox/ctx.py": "the runtime side of ctx: tests/sandbox/test_runner.py (kv, fetch and log relayed) "
                                "and tests/tools/test_services.py",
    "brainstem/sandbox/fork_client.py": "starting, restarting and stopping the fork server: "
                                        "tests/sandbox/test_runner.py and tests/sandbox/kernel/test_setup.py",
    "brainstem/sandbox/forkserver.py": "the fork server, seen from outside: tests/sandbox/kernel/test_setup.py, "
                                       "tests/sandbox/test_worker.py and tests/sandbox/test_pool.py",
    "brainstem/sandbox/guards.py": "RestrictedPython's guards: tests/sandbox/test_restricted.py and the escape "
                                   "suite tests/hostile/test_escapes.py",
    "brainstem/sandbox/isolation_report.py": "which protections workers have: tests/sandbox/kernel/test_setup.py "
                                             "(the report) and tests/operator/commands/test_status.py",
    "brainstem/sandbox/kernel/caps.py": "kernel isolation is tested on real processes as a whole: "
                                        "tests/sandbox/kernel/test_setup.py",
    "brainstem/sandbox/kernel/landlock.py": "kernel isolation is tested on real processes as a whole: "
                                            "tests/sandbox/kernel/test_setup.py",
    "brainstem/sandbox/kernel/libc.py": "ctypes plumbing of the kernel layers: tests/sandbox/kernel/test_setup.py "
                                        "and tests/sandbox/kernel/test_seccomp.py",
    "brainstem/sandbox/kernel/lockdown.py": "each worker's lock-down, seen from /proc: "
                                            "tests/sandbox/kernel/test_setup.py and tests/sandbox/test_worker.py",
    "brainstem/sandbox/kernel/probe.py": "the probe at fork server start: tests/sandbox/kernel/test_setup.py (a layer "
                                         "that breaks the probe worker is backed off and reported)",
    "brainstem/sandbox/kernel/procfs.py": "what /proc says of a process: tests/sandbox/kernel/test_setup.py "
                                          "(user namespaces mapped for a runtime that is not root)",
    "brainstem/sandbox/kernel/report.py": "what the fork server reports: tests/sandbox/kernel/test_setup.py",
    "brainstem/sandbox/kernel/switch.py": "BRAINSTEM_SANDBOX_ISOLATION: tests/sandbox/kernel/test_setup.py "
                                          "(its values, and a layer switched off is really off)",
    "brainstem/sandbox/kernel/syscalls.py": "the syscall table, checked against the kernel headers and libseccomp "
                                            "in tests/sandbox/kernel/test_seccomp.py",
    "brainstem/sandbox/protocol.py": "frames and exact-type JSON between runtime and worker: "
                                     "tests/sandbox/test_runner.py (non-JSON results, lying str subclasses, depth)",
    "brainstem/sandbox/tool_builtins.py": "what tool code finds without asking: tests/sandbox/test_restricted.py "
                                          "and tests/hostile/test_escapes.py",
    "brainstem/session/build.py": "putting a session together: every wake in tests/e2e/test_wake.py, and "
                                  "tests/session/test_gate.py builds sessions in-process",
    "brainstem/session/crash.py": "a dead session found by the next wake: tests/e2e/test_wake.py and "
                                  "tests/e2e/test_lifecycle_faults.py",
    "brainstem/session/cycle.py": "reflexes, orient, the plan and reflection in order: tests/e2e/test_wake.py and "
                                  "tests/state/test_reflexes.py",
    "brainstem/session/ending.py": "outcomes, the next wake and the history: tests/e2e/test_wake_outcomes.py, "
                                   "tests/e2e/test_lifecycle_faults.py and tests/session/test_executor.py "
                                   "(clamp_sleep)",
    "brainstem/session/ground_truth.py": "credit, balance and store usage: tests/tools/test_adapters.py (the balance "
                                         "checkers) and tests/e2e/test_wake.py (the wallet's RPC)",
    "brainstem/session/interrupt.py": "SIGTERM and SIGINT to a wake: tests/e2e/test_lifecycle_faults.py and "
                                      "tests/session/test_wake.py",
    "brainstem/session/orient.py": "orient's call for a plan: tests/e2e/test_wake.py (bad orient answers, "
                                   "a missing template variable)",
    "brainstem/session/reflect.py": "reflection and deep reflection: tests/e2e/test_reflection.py, "
                                    "tests/session/test_gate.py and tests/session/test_replay.py",
    "brainstem/session/replay_report.py": "a replay's report: tests/session/test_replay.py (text and JSON)",
    "brainstem/session/stopping.py": "why a session stops early: tests/session/test_wake.py (shutdown) and "
                                     "tests/store/test_store.py (a store fault mid-session)",
    "brainstem/state/sleep.py": "the sleep path: tests/e2e/test_wake.py (every documented form of wake), "
                                "tests/state/test_inbox.py (an urgent message wakes it), and "
                                "tests/session/test_schedule_run.py and tests/e2e/test_schedules.py (a due "
                                "schedule sends it down the full path, one that is not due does not)",
    "brainstem/store/redis/errors.py": "Redis's failures as one line: tests/store/test_store.py "
                                       "(replica, password, restart) and tests/store/redis/test_client.py",
    "brainstem/store/redis/scripts.py": "the Redis store's key layout and scripts: the contract in "
                                        "tests/store/test_base.py and one hash slot per agent in "
                                        "tests/store/redis/test_client.py",
    "brainstem/store/redis/store.py": "the Redis backend: the store contract in tests/store/test_base.py runs on it",
    "brainstem/store/sqlite/errors.py": "SQLite's failures told apart: tests/store/test_store.py (locked, full, "
                                        "read-only) and tests/operator/commands/test_context.py (a corrupt file)",
    "brainstem/store/sqlite/file.py": "the SQLite file on disk: tests/store/test_store.py (read-only) and "
                                      "tests/hostile/test_agent_isolation.py (owner-only)",
    "brainstem/store/sqlite/schema.py": "SQLite's tables and their migration: tests/store/test_base.py "
                                        "(a file from an older version opens as it was)",
    "brainstem/store/sqlite/store.py": "the SQLite backend: the store contract in tests/store/test_base.py runs on it",
    "brainstem/store/unrecorded.py": "session ends kept on disk for the next wake: tests/e2e/test_lifecycle_faults.py "
                                     "(notes swept or kept) and tests/store/test_store.py (a disk that fills)",
    "brainstem/tools/bot_api.py": "the Bot API on the wire: tests/daemon/test_telegram.py (against the Bot API "
                                  "double) and tests/tools/test_operator_chat.py",
    "brainstem/tools/policy.py": "what the operator allows code: tests/core/test_secrets.py (bindings, grants) and "
                                 "tests/tools/test_services.py",
    "brainstem/tools/tool.py": "a tool's code and meta: tests/tools/test_schema.py, tests/tools/test_services.py "
                               "(every seeded tool's meta) and tests/operator/commands/test_karma.py (tool ls)",
}


def _defines_something(init: Path) -> bool:
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               for node in ast.parse(init.read_text()).body)


def mirrored(module: Path) -> Path | None:
    """The test file of ``module`` (a path under brainstem/), or None for a package that only names its modules."""
    rel = module.relative_to(PACKAGE)
    if rel.name == "__init__.py":
        if not _defines_something(module):
            return None
        return TESTS / rel.parent / f"test_{rel.parent.name or 'brainstem'}.py"
    return TESTS / rel.parent / f"test_{rel.stem}.py"


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_every_module_has_a_test_file_or_says_where_it_is_tested():
    missing = [f"{_name(m)}: {_name(t)}" for m in modules()
               if (t := mirrored(m)) is not None and not t.exists() and _name(m) not in ELSEWHERE]
    assert not missing, ("a module without its test file (write it, or say in ELSEWHERE where the module is "
                         "tested):\n" + "\n".join(missing))


def test_every_entry_names_a_module_without_a_test_file_of_its_own():
    known = {_name(m): mirrored(m) for m in modules()}
    gone = [name for name in ELSEWHERE if name not in known]
    assert not gone, f"ELSEWHERE names modules that do not exist: {gone}"
    mirrored_now = [name for name, t in known.items() if name in ELSEWHERE and t is not None and t.exists()]
    assert not mirrored_now, f"these have a test file of their own now; drop their entries: {mirrored_now}"
    nothing_to_test = [name for name, t in known.items() if name in ELSEWHERE and t is None]
    assert not nothing_to_test, f"these only name their modules and need no entry: {nothing_to_test}"


def test_every_entry_says_where_in_test_files_that_exist():
    for module, reason in ELSEWHERE.items():
        cited = re.findall(r"tests/[\w/]+\.py", reason)
        assert cited, f"{module}: the reason names no test file"
        absent = [c for c in cited if not (REPO / c).is_file()]
        assert not absent, f"{module}: no such test file {absent}"


def test_every_test_file_in_a_layer_folder_tests_a_module_at_the_same_place():
    layers = {name for name, _, _ in brainstem.LAYERS}
    strays = []
    for test in sorted(TESTS.rglob("test_*.py")):
        rel = test.relative_to(TESTS)
        if len(rel.parts) == 1 or rel.parts[0] not in layers:
            continue
        name, folder = rel.stem.removeprefix("test_"), PACKAGE / rel.parent
        if not (folder / f"{name}.py").is_file() and not (folder.name == name and (folder / "__init__.py").is_file()):
            strays.append(_name(test))
    assert not strays, ("test files that mirror no module (name them after the module they test, or move a "
                        "journey to tests/e2e/ and an attack to tests/hostile/):\n" + "\n".join(strays))


def test_the_top_of_tests_holds_the_layers_the_journeys_the_attacks_and_the_repositorys_own_tests():
    layers = {name for name, _, _ in brainstem.LAYERS}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name not in ("__pycache__", "artifacts")}
    assert folders <= layers | set(BESIDE_THE_MIRROR), (
        f"folders at the top of tests/ that are no layer and not one of {BESIDE_THE_MIRROR}: "
        f"{folders - layers - set(BESIDE_THE_MIRROR)}")
    flat = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert set(flat) <= set(REPOSITORY_TESTS), (
        f"a test of a module goes in its layer's folder, not at the top of tests/: {set(flat) - set(REPOSITORY_TESTS)}")


def test_every_test_folder_is_a_package_so_test_files_may_share_a_name():
    """tests/e2e/test_wake.py and tests/session/test_wake.py import as two modules only inside packages."""
    folders = [p for p in TESTS.rglob("*") if p.is_dir() and p.name not in ("__pycache__", "artifacts")
               and "artifacts" not in p.relative_to(TESTS).parts]
    missing = [_name(p) for p in [TESTS, *folders] if not (p / "__init__.py").is_file()]
    assert not missing, f"test folders without __init__.py: {missing}"
