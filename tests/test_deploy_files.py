"""The deployment files work as written: the systemd units, the crontab line, docker compose and .env.example
agree with each other and with the docs, and the tools that can check them (systemd-analyze, the compose
client) do, where this machine has them."""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "scripts" / "systemd"
SERVICES = ("brainstem-wake.service", "brainstem-run.service")
BINARY = "/opt/brainstem/venv/bin/brainstem"
STORE = "sqlite:////var/lib/brainstem/brainstem.db"
ENV_FILE = "/etc/brainstem/brainstem.env"
USERADD = "useradd --system --home-dir /var/lib/brainstem --shell /usr/sbin/nologin brainstem"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read_string((UNITS / name).read_text())
    return parser


@pytest.mark.parametrize("name", SERVICES)
def test_the_service_units_run_the_venv_install_as_their_user_on_their_state_directory(name):
    service = unit(name)["Service"]
    assert service["User"] == "brainstem"
    assert service["ExecStart"].startswith(BINARY + " ")
    assert service["StateDirectory"] == "brainstem"  # systemd creates /var/lib/brainstem, owned by the user
    assert service["Environment"] == f"BRAINSTEM_KV={STORE}"
    assert service["EnvironmentFile"] == f"-{ENV_FILE}"
    # The store is under /var/lib, so the home directory may stay read-only.
    assert service["ProtectHome"] == "read-only"
    assert service["ProtectSystem"] == "strict" and service["NoNewPrivileges"] == service["PrivateTmp"] == "yes"
    # The sandbox makes a user and a network namespace of its own: nothing may take them away.
    assert not {"RestrictNamespaces", "PrivateUsers"} & set(service)


def test_both_services_run_the_same_install_on_the_same_store():
    wake, run = (unit(name)["Service"] for name in SERVICES)
    for key in ("User", "StateDirectory", "Environment", "EnvironmentFile", "NoNewPrivileges", "PrivateTmp",
                "ProtectSystem", "ProtectHome"):
        assert wake[key] == run[key], key
    assert wake["ExecStart"].split()[0] == run["ExecStart"].split()[0] == BINARY


def test_the_timer_fires_every_five_minutes_on_the_clock_and_catches_up_after_downtime():
    timer = unit("brainstem-wake.timer")["Timer"]
    assert timer["OnCalendar"] == "*:0/5"
    # Persistent= acts on OnCalendar= alone; beside only monotonic timers (OnBootSec=, OnUnitActiveSec=)
    # it does nothing, so a fire missed while the machine was off would never run.
    assert timer["Persistent"] == "true"
    assert not {"OnBootSec", "OnUnitActiveSec", "OnActiveSec", "OnStartupSec", "OnUnitInactiveSec"} & set(timer)
    if shutil.which("systemd-analyze"):
        r = subprocess.run(["systemd-analyze", "calendar", "--iterations", "2", timer["OnCalendar"]],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        nexts = re.findall(r"(?:Next elapse|Iter\. #2): \w+ \S+ (\d\d):(\d\d):00", r.stdout)
        assert len(nexts) == 2, r.stdout
        (h1, m1), (h2, m2) = ((int(h), int(m)) for h, m in nexts)
        assert int(m1) % 5 == 0 and ((h2 * 60 + m2) - (h1 * 60 + m1)) % 1440 == 5, r.stdout


def install_steps_in_the_unit() -> list[str]:
    lines = (UNITS / "brainstem-wake.service").read_text().splitlines()
    start = lines.index("# Install (as root), once, from a clone of the repository:") + 1
    steps = []
    for line in lines[start:]:
        if not line.startswith("#   "):
            break
        steps.append(line[4:])
    return steps


def install_steps_in_the_docs() -> list[str]:
    docs = (REPO / "docs" / "running.md").read_text()
    block = re.search(r"```sh\n(  useradd .*?)\n  ```", docs, re.S).group(1)
    return [line[2:] for line in block.splitlines()]


def test_the_unit_and_the_docs_give_the_same_install_steps():
    steps = install_steps_in_the_unit()
    assert steps == install_steps_in_the_docs()
    assert steps[0] == USERADD
    # The seed runs before any unit has started, so before systemd has made the state directory: the
    # steps make it, owned by the user, first; and seed the units' store, as that user.
    make_dir = steps.index("install -d -o brainstem -g brainstem -m 0750 /var/lib/brainstem")
    seed = next(i for i, s in enumerate(steps) if s.startswith("runuser -u brainstem -- env BRAINSTEM_KV=" + STORE))
    assert make_dir < seed and f"{BINARY} seed --soul /var/lib/brainstem/soul.md" in steps[seed + 1]
    venv = "python3 -m venv /opt/brainstem/venv && /opt/brainstem/venv/bin/pip install"
    assert any(s.startswith(venv) for s in steps)
    assert any(f"install -m 0640 .env.example {ENV_FILE}" in s for s in steps)
    assert steps[-1].endswith("systemctl enable --now brainstem-wake.timer")
    run = (UNITS / "brainstem-run.service").read_text()
    assert "systemctl enable --now brainstem-run.service" in run


def test_what_the_units_say_about_stopping_is_what_the_docs_say():
    run = (UNITS / "brainstem-run.service").read_text()
    assert "stops at its next step or LLM call, or after\n# --grace seconds (30)" in run
    assert int(unit("brainstem-run.service")["Service"]["TimeoutStopSec"].rstrip("s")) > 30  # longer than --grace
    docs = (REPO / "docs" / "running.md").read_text()
    assert "under `brainstem run`, at its next step or LLM call" in docs
    assert "143" in unit("brainstem-wake.service")["Service"]["SuccessExitStatus"]  # wake's SIGTERM: at once


NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
REPORT = "import json; from brainstem.sandbox import report; print(json.dumps(report()))"


def interpreter_for_nobody() -> list[str] | None:
    """A Python the unprivileged uid can run brainstem with (this one may sit under /root), or None."""
    if os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("unshare")):
        return None
    path = f"{REPO}:{sysconfig.get_paths()['purelib']}"
    check = "import sys, RestrictedPython, brainstem; print(sys.version_info[:2])"
    for python in (sys.executable, "/usr/bin/python3"):
        r = subprocess.run([*NOBODY, "env", "-i", f"PYTHONPATH={path}", python, "-c", check],
                           capture_output=True, text=True, timeout=30)
        if r.returncode == 0 and r.stdout.strip() == str(tuple(sys.version_info[:2])):
            return ["env", "-i", "PATH=/usr/bin:/bin", "HOME=/tmp", f"PYTHONPATH={path}", python]
    return None


def sandbox_states(prefix: list[str]) -> dict[str, str]:
    r = subprocess.run([*prefix, "-c", REPORT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["available"], report
    return {name: p["state"] for name, p in report["protections"].items()}


def under_tmp_kept() -> list[Path]:
    """What the hardened run needs that lies under /tmp, outermost only: the checkout, and the interpreter
    and its packages (a venv, a CI clone in a mktemp directory, a Python installed there)."""
    needed = {REPO, Path(sys.prefix), Path(sys.base_prefix), Path(sysconfig.get_paths()["purelib"]),
              Path(os.path.realpath(sys.executable)).parent}
    under = {p.resolve() for p in needed if p.resolve().is_relative_to("/tmp")}
    return sorted(p for p in under if not any(p != q and p.is_relative_to(q) for q in under))


def private_tmp(staging: Path, keep: list[Path] | None = None) -> str:
    """Shell that puts an empty tmpfs over /tmp, as PrivateTmp does, with ``keep`` (:func:`under_tmp_kept`)
    bound back into it: the tmpfs is filled at ``staging``, then moved over /tmp; nothing outside changes."""
    script = f'mount -t tmpfs tmpfs "{staging}" && '
    for path in under_tmp_kept() if keep is None else keep:
        inside = staging / path.relative_to("/tmp")
        script += f'mkdir -p "{inside}" && mount --bind "{path}" "{inside}" && '
    return script + f'mount --move "{staging}" /tmp && '


def test_a_private_tmp_keeps_what_the_run_needs_from_under_tmp_and_nothing_else(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare") or not tmp_path.is_relative_to("/tmp"):
        pytest.skip("needs root, unshare and pytest's temporary directory under /tmp")
    kept = tmp_path / "checkout" / "venv"
    kept.mkdir(parents=True)
    (kept / "python").write_text("interpreter\n")
    (tmp_path / "other").write_text("anything else under /tmp")
    staging = tmp_path / "private"
    staging.mkdir()
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        private_tmp(staging, [kept]) + f'cat "{kept}/python"; ls -A /tmp'],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "interpreter" and lines[1:] == [kept.relative_to("/tmp").parts[0]], lines
    assert (tmp_path / "other").exists() and not any(staging.iterdir())  # outside, nothing changed


@pytest.mark.slow
@pytest.mark.skipif(interpreter_for_nobody() is None,
                    reason="needs root, setpriv, unshare and a Python an unprivileged uid can run brainstem with")
def test_the_units_hardening_costs_the_sandbox_nothing_but_the_uid_drop(tmp_path):
    """What the units' comments claim: as a user of its own, the sandbox loses the uid drop only, and
    NoNewPrivileges, a read-only file system (ProtectSystem=strict) and a private /tmp (PrivateTmp) cost
    it nothing more. The hardened run is approximated with setpriv and a mount namespace, from a checkout
    and an interpreter anywhere (under /tmp too: they are bound back into the private /tmp)."""
    python = interpreter_for_nobody()
    as_root = sandbox_states(python)
    as_user = sandbox_states([*NOBODY, *python])
    staging = tmp_path / "private-tmp"
    staging.mkdir()
    hardened = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'{private_tmp(staging)}mount -o remount,bind,ro / && exec "$@"', "sh", *NOBODY, "--no-new-privs"]
    assert sandbox_states([*hardened, *python]) == as_user
    # PrivateTmp is needed, not just harmless: without Landlock the sandbox chroots into an empty
    # directory it makes in /tmp, which ProtectSystem=strict alone would leave read-only.
    without_landlock = [*python[:2], "BRAINSTEM_SANDBOX_ISOLATION=off:landlock", *python[2:]]
    assert sandbox_states([*hardened, *without_landlock])["filesystem"] == "on"
    assert as_user["uid_drop"] == "off" and as_user["seccomp"] == as_user["no_new_privs"] == "on"
    # Everything root has on but the uid drop stays on, where the kernel allows unprivileged user
    # namespaces (without them the network namespace goes too: the kernel's doing, not the units').
    lost = {name for name, state in as_root.items() if state == "on" and as_user[name] != "on"}
    assert lost == {"uid_drop"} or as_user["user_namespace"] != "on", lost


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_units(tmp_path):
    # verify wants ExecStart's binary to exist: the units are checked with a stand-in for the venv's.
    for name in (*SERVICES, "brainstem-wake.timer"):
        (tmp_path / name).write_text((UNITS / name).read_text().replace(BINARY, "/bin/true"))
    names = [str(tmp_path / n) for n in (*SERVICES, "brainstem-wake.timer")]
    r = subprocess.run(["systemd-analyze", "verify", *names], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr  # a value it could not parse is only a warning
    # ...and it does check: a value it cannot parse is reported, a relative ExecStart refused.
    ignored = tmp_path / "ignored.service"
    ignored.write_text("[Service]\nExecStart=/bin/true\nProtectHome=maybe\n")
    r = subprocess.run(["systemd-analyze", "verify", str(ignored)], capture_output=True, text=True, timeout=60)
    assert "ProtectHome" in r.stderr or "protect home" in r.stderr.lower()
    broken = tmp_path / "broken.service"
    broken.write_text("[Service]\nExecStart=brainstem wake\n")
    r = subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0


CRON_LOG = "/var/lib/brainstem/wake.log"


def cron_line() -> str:
    lines = [line for line in (REPO / "scripts" / "crontab.example").read_text().splitlines()
             if line and not line.startswith("#")]
    assert len(lines) == 1
    return lines[0]


def test_one_cron_line_loads_the_env_file_in_the_example_and_the_docs():
    line = cron_line()
    assert f". {ENV_FILE}" in line and f"{BINARY} wake --quiet" in line
    assert f"`{line}`" in (REPO / "docs" / "running.md").read_text()
    assert "crontab -u brainstem scripts/crontab.example" in (REPO / "docs" / "running.md").read_text()


def run_cron_command(tmp_path: Path, env_file: str | None) -> tuple[int, str]:
    """The crontab line's command, run by sh as cron runs it, with the env file, the binary (a stand-in
    that prints what it got) and the log moved under tmp_path. Returns sh's status and the log."""
    command = cron_line().split(None, 5)[5]  # after the five schedule fields
    assert "%" not in command  # cron would turn it into a newline
    fake = tmp_path / "brainstem"
    fake.write_text('#!/bin/sh\necho "store=$BRAINSTEM_KV key=$OPENROUTER_API_KEY args=$*"\n')
    fake.chmod(0o755)
    log = tmp_path / "wake.log"
    env = tmp_path / "brainstem.env"
    if env_file is not None:
        env.write_text(env_file)
    for real, stand_in in ((ENV_FILE, env), (BINARY, fake), (CRON_LOG, log)):
        assert real in command
        command = command.replace(real, str(stand_in))
    r = subprocess.run(["/bin/sh", "-c", command], env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                       capture_output=True, text=True, timeout=10)
    assert r.stdout == r.stderr == ""  # cron would mail it: everything goes to the log
    return r.returncode, log.read_text()


def test_the_cron_line_wakes_the_units_store_with_the_env_files_settings(tmp_path):
    code, log = run_cron_command(tmp_path, "OPENROUTER_API_KEY=sk-from-the-env-file\n")
    assert code == 0
    assert log == f"store={STORE} key=sk-from-the-env-file args=wake --quiet\n"


def test_the_env_files_store_wins_over_the_cron_lines_default(tmp_path):
    code, log = run_cron_command(tmp_path, "BRAINSTEM_KV=redis://127.0.0.1:6379/0\n")
    assert code == 0 and log.startswith("store=redis://127.0.0.1:6379/0 ")


def test_a_missing_env_file_stops_the_cron_line_before_the_wake_and_says_so_in_the_log(tmp_path):
    code, log = run_cron_command(tmp_path, None)
    assert code != 0 and "brainstem.env" in log and "store=" not in log


def compose_text() -> str:
    return (REPO / "docker-compose.yml").read_text()


def test_compose_needs_a_redis_password_of_your_own():
    text = compose_text()
    assert '${REDIS_PASSWORD:?' in text  # none at all: compose refuses to start
    # The example's password: the Redis container refuses it before starting the server.
    script = re.search(r"- >-\n((?:        .*\n)+)", text).group(1)
    script = " ".join(line.strip() for line in script.splitlines()).replace("$$", "$")
    script = script.replace("exec redis-server", "exec echo started; : ")
    cases = (("change-me", 1, "REDIS_PASSWORD is change-me, a placeholder"), ("s3cret-of-mine", 0, "started"))
    for password, code, said in cases:
        r = subprocess.run(["sh", "-c", script], env={"REDIS_PASSWORD": password, "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == code and said in r.stdout + r.stderr, (password, r.stdout, r.stderr)


def test_env_example_documents_every_variable_compose_the_units_and_cron_set_or_read():
    env_example = (REPO / ".env.example").read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)", compose_text()))
    assert used == {"REDIS_PASSWORD", "BRAINSTEM_EVERY"}
    used |= set(re.findall(r"^\s+([A-Z_]+): ", compose_text(), re.M))  # environment: entries
    for name in SERVICES:
        used.add(unit(name)["Service"]["Environment"].split("=", 1)[0])
    used |= set(re.findall(r"\b([A-Z_]+)=", cron_line()))
    assert "BRAINSTEM_KV" in used
    for name in used:
        assert re.search(rf"^#? ?{name}=", env_example, re.M), name
    assert "change-me" not in re.findall(r"^REDIS_PASSWORD=(.*)$", env_example, re.M)[0]
    # A systemd or cron install copies the same file: it must not point the store at a Redis that is not there.
    assert not re.search(r"^BRAINSTEM_KV=", env_example, re.M)


def compose_client() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


@pytest.mark.skipif(compose_client() is None, reason="no compose client installed")
def test_the_compose_client_accepts_it_with_a_password_and_refuses_it_without(tmp_path):
    shutil.copy(REPO / "docker-compose.yml", tmp_path / "docker-compose.yml")
    shutil.copy(REPO / ".env.example", tmp_path / ".env")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    run = lambda password: subprocess.run([*compose_client(), "config", "--quiet"], cwd=tmp_path,  # noqa: E731
                                          env={"PATH": "/usr/bin:/bin:/usr/local/bin", "REDIS_PASSWORD": password},
                                          capture_output=True, text=True, timeout=60)
    assert run("s3cret-of-mine").returncode == 0
    refused = run("")
    assert refused.returncode != 0 and "REDIS_PASSWORD" in refused.stderr


ETHEREUM = re.compile(r"^(web3|eth[-_].*|ckzg|py[-_]ecc)$", re.I)


def resolved_install(target: str) -> set[str]:
    """The distributions `pip install TARGET` would install into an empty environment (a dry run)."""
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                        "--report", "-", target], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    return {item["metadata"]["name"] for item in json.loads(r.stdout)["install"]}


@pytest.mark.slow
def test_a_plain_install_brings_no_ethereum_stack_and_the_wallet_extra_does():
    light = resolved_install(".")
    assert "brainstem" in light and "httpx" in light
    assert not {name for name in light if ETHEREUM.match(name)}, light
    wallet = resolved_install(".[wallet]")
    assert "web3" in wallet and wallet > light


def test_the_wallet_extra_is_the_only_way_in_for_web3_and_production_installs_it():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("web3")]
    assert [d for d in project["optional-dependencies"]["wallet"] if d.startswith("web3")]
    assert "brainstem[wallet]" in project["optional-dependencies"]["test"]  # CI runs the wallet's tests
    assert 'pip install --no-cache-dir ".[wallet]"' in (REPO / "Dockerfile").read_text()
    assert any(s.endswith("pip install '.[wallet]'") for s in install_steps_in_the_unit())
