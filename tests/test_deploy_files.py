"""The deployment files work as written: the systemd units, the crontab line, docker compose and .env.example
agree with each other and with the docs, and the tools that can check them (systemd-analyze, the compose
client) do, where this machine has them."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
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
    assert service["ReadWritePaths"] == "/var/lib/brainstem"
    # The store is under /var/lib, so the home directory may stay read-only.
    assert service["ProtectHome"] == "read-only"


def test_the_units_say_how_to_install_them():
    wake = (UNITS / "brainstem-wake.service").read_text()
    steps = (USERADD, "python3 -m venv /opt/brainstem/venv", ENV_FILE, "systemctl enable --now brainstem-wake.timer")
    for step in steps:
        assert step in wake, step
    run = (UNITS / "brainstem-run.service").read_text()
    assert "systemctl enable --now brainstem-run.service" in run
    fleet_and_running = (REPO / "docs" / "running.md").read_text()
    assert USERADD in fleet_and_running and BINARY in fleet_and_running


def test_what_the_units_say_about_stopping_is_what_the_docs_say():
    run = (UNITS / "brainstem-run.service").read_text()
    assert "stops at its next step or LLM call, or after\n# --grace seconds (30)" in run
    assert int(unit("brainstem-run.service")["Service"]["TimeoutStopSec"].rstrip("s")) > 30  # longer than --grace
    docs = (REPO / "docs" / "running.md").read_text()
    assert "under `brainstem run`, at its next step or LLM call" in docs
    assert "143" in unit("brainstem-wake.service")["Service"]["SuccessExitStatus"]  # wake's SIGTERM: at once


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_units(tmp_path):
    # verify wants ExecStart's binary to exist: the units are checked with a stand-in for the venv's.
    for name in (*SERVICES, "brainstem-wake.timer"):
        (tmp_path / name).write_text((UNITS / name).read_text().replace(BINARY, "/bin/true"))
    names = [str(tmp_path / n) for n in (*SERVICES, "brainstem-wake.timer")]
    r = subprocess.run(["systemd-analyze", "verify", *names], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # ...and it does check: a unit with a relative ExecStart is refused.
    broken = tmp_path / "broken.service"
    broken.write_text("[Service]\nExecStart=brainstem wake\n")
    r = subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0


def test_one_cron_line_loads_the_env_file_in_the_example_and_the_docs():
    example = [line for line in (REPO / "scripts" / "crontab.example").read_text().splitlines()
               if line and not line.startswith("#")]
    assert len(example) == 1
    line = example[0]
    assert f". {ENV_FILE}" in line and f"{BINARY} wake --quiet" in line
    assert f"`{line}`" in (REPO / "docs" / "running.md").read_text()


def compose_text() -> str:
    return (REPO / "docker-compose.yml").read_text()


def test_compose_needs_a_redis_password_of_your_own():
    text = compose_text()
    assert '${REDIS_PASSWORD:?' in text  # none at all: compose refuses to start
    # The example's password: the Redis container refuses it before starting the server.
    script = re.search(r"- >-\n((?:        .*\n)+)", text).group(1)
    script = " ".join(line.strip() for line in script.splitlines()).replace("$$", "$")
    script = script.replace("exec redis-server", "exec echo started; : ")
    for password, code, said in (("change-me", 1, "REDIS_PASSWORD is the example's"), ("s3cret-of-mine", 0, "started")):
        r = subprocess.run(["sh", "-c", script], env={"REDIS_PASSWORD": password, "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == code and said in r.stdout + r.stderr, (password, r.stdout, r.stderr)


def test_env_example_documents_every_variable_compose_reads():
    env_example = (REPO / ".env.example").read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)", compose_text()))
    assert used == {"REDIS_PASSWORD", "BRAINSTEM_EVERY"}
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
