"""How long `pip install -e .` takes into a fresh venv with no pip cache, and what it brings.

Each run makes a new virtual environment and times `pip install -e SRC` in it with
PIP_NO_CACHE_DIR=1, so nothing comes from pip's cache (wheels still come from wherever pip's
configuration points: an index, a local mirror). SRC is this checkout, and with --against REV
also that commit, exported with `git archive`; runs alternate between them so both see the same
load. Prints the median wall time, the distributions installed, the size of site-packages and
whether any of the Ethereum stack (web3, eth-*, ckzg, py_ecc) came with it.

Target: a plain install brings none of the Ethereum stack (it is the `brainstem[wallet]` extra),
and with --against, takes less time than that commit's.

    python bench/install.py --against a2413b8 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ETHEREUM = re.compile(r"^(web3|eth[-_].*|ckzg|py[-_]ecc)$", re.I)


def export(rev: str, into: Path) -> Path:
    """The tree of commit ``rev`` written out under ``into``."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def one_install(src: Path, work: Path) -> dict:
    """A fresh venv, `pip install -e src` timed in it; what it installed."""
    venv = Path(tempfile.mkdtemp(prefix="venv-", dir=work))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    t0 = time.monotonic()
    subprocess.run([*pip, "install", "--quiet", "-e", str(src)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.monotonic() - t0
    listed = json.loads(subprocess.run([*pip, "list", "--format", "json"], check=True, capture_output=True,
                                       text=True, env=env).stdout)
    names = {d["name"] for d in listed} - {"pip", "setuptools", "wheel"}
    site = next((venv / "lib").glob("python3*/site-packages"))
    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    return {"seconds": seconds, "dists": len(names), "mb": size / 1e6,
            "ethereum": sorted(n for n in names if ETHEREUM.match(n))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", metavar="REV", help="also install this commit, for comparison")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="brainstem-install-") as tmp:
        work = Path(tmp)
        sources = {"this checkout": REPO}
        if args.against:
            sources[args.against] = export(args.against, work / "against")
        results: dict[str, list[dict]] = {name: [] for name in sources}
        for _ in range(args.runs):
            for name, src in sources.items():
                results[name].append(one_install(src, work))
    print(f"pip install -e SRC into a fresh venv, PIP_NO_CACHE_DIR=1, {args.runs} run(s) each, median")
    print(f"{'source':<16} {'seconds':>8} {'dists':>6} {'MB':>6}  ethereum stack")
    medians = {}
    for name, runs in results.items():
        medians[name] = statistics.median(r["seconds"] for r in runs)
        last = runs[-1]
        print(f"{name:<16} {medians[name]:8.1f} {last['dists']:6d} {last['mb']:6.0f}  "
              f"{', '.join(last['ethereum']) or 'none'}")
    light = not results["this checkout"][-1]["ethereum"]
    faster = args.against is None or medians["this checkout"] < medians[args.against]
    print(f"target: no Ethereum stack in a plain install: {'ok' if light else 'MISSED'}")
    if args.against:
        print(f"target: faster than {args.against}: {'ok' if faster else 'MISSED'} "
              f"({medians['this checkout'] / medians[args.against]:.2f}x)")
    return 0 if light and faster else 1


if __name__ == "__main__":
    sys.exit(main())
