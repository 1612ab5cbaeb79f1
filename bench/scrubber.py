"""What the sandbox's scrubber costs: the text handed to tools, and what they send, checked for secrets.

Prints the time a fetch answer takes on its way to a tool (the exact text the request carried put back
as its placeholder, then the whole answer looked through for any other secret text) for 1 MB of
ordinary text, 1 MB of JSON full of escapes, a 1 MB hex blob and a small fetch answer, against a
baseline measured in the same run: one compiled pattern of every secret's whole encoded forms (what a
plain substring redactor costs). Target: a 1 MB answer (the largest a fetch returns) in at most 0.5 s,
and a small answer in at most 2 ms.

    python bench/scrubber.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from brainstem.core.scrubber import Scrubber, put_back  # noqa: E402
from brainstem.core.secrets import forms_pattern, secret_forms  # noqa: E402

SECRETS = {"OPENROUTER_API_KEY": "sk-or-v1-" + "5be1c0de9f3a7d21" * 4,
           "TELEGRAM_BOT_TOKEN": "8123456789:AAHq2xV7kP0rS9tU",
           "secret:db_pw": "correct-horse-battery-staple", "BRAINSTEM_DASHBOARD_TOKEN": "d4sh-7f3a9c2e41d8b605"}
MB = 1_000_000


def texts() -> dict[str, str]:
    words = "the agent read the page and wrote a note about what it found there, then slept; "
    prose = (words * (MB // len(words) + 1))[:MB]
    doc = json.dumps([{"title": "caf\u00e9 & co", "url": "https:\\/\\/example.org\\/a?b=c%20d", "n": i}
                      for i in range(20_000)])[:MB]
    hexblob = ("0x" + "a3f9" * (MB // 4))[:MB]
    small = json.dumps({"status": 200, "text": prose[:4000]})
    return {"prose, 1 MB": prose, "JSON with escapes, 1 MB": doc, "hex, 1 MB": hexblob, "fetch answer, 4 KB": small}


def median_seconds(fn, runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per text (median reported)")
    args = parser.parse_args()
    placeholder = "brainstem-secret-OPENROUTER_API_KEY-0a1b2c"
    scrubber = Scrubber(SECRETS, opaque=[placeholder])
    sent = {SECRETS["OPENROUTER_API_KEY"]: placeholder}  # what the request carried: its echo is put back

    def handed(text: str) -> list[str]:
        return scrubber.held(put_back(text, sent))

    plain = forms_pattern(f for v in SECRETS.values() for f in secret_forms(v))
    handed("warm up the compiled patterns")
    good = True
    print(f"{'text':26} {'baseline (ms)':>14} {'scrubber (ms)':>14} {'ratio':>7}  target")
    for name, text in texts().items():
        base = median_seconds(lambda t=text: plain.sub("[REDACTED]", t), args.runs)
        ours = median_seconds(lambda t=text: handed(t), args.runs)
        limit = 0.5 if len(text) >= MB else 0.002
        ok = ours <= limit
        good = good and ok
        print(f"{name:26} {base * 1000:14.2f} {ours * 1000:14.2f} {ours / base:7.1f}  <= {limit * 1000:.0f} ms "
              f"{'ok' if ok else 'MISSED'}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
