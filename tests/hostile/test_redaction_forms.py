"""Karma keeps no form of what the runtime holds, not just the exact value: an LLM endpoint that echoes the
key base64'd, hex'd, reversed or URL-escaped in its error leaves none of them in karma; and a model's answer
or a host's error holding one is withheld whole, never masked where it matched."""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest

from brainstem.core.secrets import secret_forms
from brainstem.store.karma import Redactor
from tests.wake_helpers import API_KEY, answers, plan, run_wake, wake_env


def test_redactor_catches_the_common_encodings_at_any_alignment():
    value = "123456:sk-or/v1+0123456789abcdef"
    r = Redactor({"KEY": value})
    blobs = [value, value[::-1], value.encode().hex(), value.encode().hex().upper(),
             base64.b64encode(value.encode()).decode(), base64.urlsafe_b64encode(value.encode()).decode(),
             json.dumps({"k": value}), "k=" + urllib.parse.quote(value, safe=""),
             "k=" + urllib.parse.quote_plus(value)]
    for lead in ("", "B", "Be", "Bearer "):
        blobs.append(base64.b64encode((lead + value).encode()).decode())
    for blob in blobs:
        out = r.text("before " + blob + " after")
        assert "[REDACTED:KEY]" in out, blob
        assert not [f for f in secret_forms(value) if f in out], (blob, out)


def test_short_values_are_not_encoded_into_false_positives():
    r = Redactor({"PIN": "1234"})
    assert r.text("MTIzNA== 31323334") == "MTIzNA== 31323334"  # encodings of short values are left alone
    assert r.text("pin 1234") == "pin [REDACTED:PIN]"


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_an_endpoint_echoing_the_key_encoded_leaves_no_form_of_it_in_karma(real_store_url, st, llm):
    echo = " ".join([base64.b64encode(API_KEY.encode()).decode(), API_KEY[::-1], API_KEY.encode().hex(),
                     base64.b64encode(b"Bearer " + API_KEY.encode()).decode()])
    llm.queue({"status": 400, "message": "bad request for key " + echo}, plan())
    llm.responder = answers()
    r = run_wake(wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1), "--force")
    assert r.returncode == 0, r.stderr
    dump = "\n".join(str(v) for k in st.list_all() for v in ([st.get(k.name)] if not k.is_log
                                                              else st.read_log(k.name)))
    # An error holding the key in any form is withheld whole (masking where it stood would answer a guess
    # the agent had the host quote), and it is a secret_refused stop.
    assert "[withheld: the error held secret text]" in dump and "bad request for key" not in dump
    assert not [f for f in secret_forms(API_KEY) if f in dump]


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_model_answer_holding_a_secret_is_never_used_or_shown_and_holds_the_agent(real_store_url, st, llm):
    """The model spelling out a guess it was asked to make: had karma marked where the guess matched,
    reflection would read the answer every step of every session. The answer is booked, never recorded
    or used; it is a secret_refused stop and the agent's code is held."""
    from brainstem.state import refusals
    from tests.wake_helpers import events_of, last_session, think

    db_pw = "correct-horse-battery-staple-42"
    st.put("secret:db_pw", db_pw)
    llm.queue(plan(think("Guess the password.", id="g")))
    llm.responder = answers("my guesses: hunter2, " + db_pw + ", letmein")
    r = run_wake(wake_env(real_store_url, llm, BRAINSTEM_TOOL_SECRETS="secret:db_pw@db.example.org"), "--force")
    assert r.returncode == 0, r.stderr
    _, entries = last_session(st)
    (refused,) = [e for e in events_of(entries, "secret_refused") if e.get("source") == "llm"]
    assert refused["secrets"] == ["secret:db_pw"]
    dump = json.dumps(entries)
    assert db_pw not in dump and "REDACTED:secret:db_pw" not in dump and "hunter2" not in dump
    assert refusals.held(st)
