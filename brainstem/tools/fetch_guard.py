"""Between a tool's ``ctx.fetch`` and the wire: secrets put in only for their hosts, what comes back handed
over only as the code may see it, requests to the LLM host metered (see :mod:`brainstem.tools.services`)."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import quote, quote_plus

from brainstem.core import events
from brainstem.core.scrubber import put_back_url
from brainstem.core.secrets import PCHAR_SAFE, Outgoing, SecretRefused, cleartext_ok
from brainstem.llm.meter import MeterRefused, SpendOverrun
from brainstem.sandbox import StopExecution
from brainstem.sandbox.egress import EgressDenied


class FetchGuard:
    """Between a tool's fetch and the wire: secrets put in only for their hosts, what comes back handed
    over only as the code may see it, requests to the LLM host metered."""

    def __init__(self, services: Any):
        self.s = services
        self.grants = services.grants
        self.meter = services._policy.meter
        # Per hop (a redirect is a new hop): the exact text put into its request -> the placeholder it stood
        # for. Only that hop's answer may echo it back; what an earlier hop carried explains nothing here.
        self._sent: dict[int, dict[str, str]] = {}

    def outgoing(self, hop):
        headers = dict(hop.headers)
        basic = {k: _basic_decode(v) for k, v in headers.items()}
        body_text = hop.body.decode("utf-8", "surrogateescape") if hop.body is not None else ""
        llm_base = self.s._policy.public.get("OPENROUTER_BASE_URL")
        req = Outgoing(host=hop.host, scheme=hop.scheme, url=hop.url, header_names=list(headers),
                       header_values=[*headers.values(), *[b for b in basic.values() if b]], body=body_text,
                       headers_only=self.meter is not None and self.meter.is_llm_host(hop.host, hop.ip),
                       cleartext_ok=cleartext_ok(hop.host, llm_base))
        held = self.s.scrubber.holds([req.url, *req.header_names, *req.header_values, req.body])
        if held:  # every hop: a redirect's URL is the server's, but the request's own parts are the tool's
            self.s.refuse_value(held, host=hop.host, port=hop.port, path=hop.path)
        try:
            found = self.grants.check(req)
        except SecretRefused as exc:
            texts = [req.url, *req.header_names, *req.header_values, req.body]
            self.s._record(events.SECRET_REFUSED, tool=self.s.name, host=hop.host, port=hop.port, path=hop.path,
                           secrets=sorted(g.name for g in self.grants.present(*texts)), reason=str(exc))
            raise EgressDenied(str(exc)) from None
        hop.note["secrets"] = [g.name for g in found]
        body = hop.body
        if self.meter is not None and self.meter.applies(hop.host, hop.port, [g.label for g in found], hop.ip):
            try:
                body = self.meter.before(hop.method, hop.path, body, hop.note, query=hop.url.partition("?")[2])
            except MeterRefused as exc:
                raise EgressDenied(str(exc)) from None
        # Sealed (see brainstem.sandbox.fetch.Hop): a hop that carries a secret, and any hop to a bound host
        # or an address a secret was sent to this session, whose answer may depend on what it was sent before
        # (a session the server keeps), whichever code asks and however the host is spelled.
        policy = self.s._policy
        hop.sealed = bool(found) or policy.sealed(hop.host, hop.ip)
        if not found:
            return hop.url, headers, body
        policy.seal(hop.ip)
        sent = self._sent.setdefault(id(hop), {})

        def put_in(text: str, grants: list, quoting=lambda v: v) -> str:
            for g in grants:
                if g.placeholder in text:
                    sent[quoting(g.value)] = sent[g.value] = g.placeholder
            return self.grants.put_in(text, grants, quoting)

        # Quoted for where it lands: a path segment may keep ':' or '&', a query value may not.
        anywhere = [g for g in found if not req.header_only(g)]
        before_query, mark, query = hop.url.partition("?")
        url = (put_in(before_query, anywhere, lambda v: quote(v, safe=PCHAR_SAFE)) + mark
               + put_in(query, anywhere, lambda v: quote(v, safe="-._~")))
        for k, v in list(headers.items()):
            if basic[k] is not None and any(g.placeholder in basic[k] for g in found):
                token = base64.b64encode(put_in(basic[k], found).encode("utf-8")).decode("ascii")
                sent[token] = next(g.placeholder for g in found if g.placeholder in basic[k])
                v = "Basic " + token
            else:
                v = put_in(v, found)
            if "\r" in v or "\n" in v:
                raise EgressDenied(f"refused: header {k} would carry a line break")
            headers[k] = v
        if body is not None:
            text = body.decode("utf-8", "surrogateescape")
            quoting = {"json": lambda v: json.dumps(v)[1:-1], "form": quote_plus}.get(hop.body_kind,
                                                                                          lambda v: v)
            body = put_in(text, anywhere, quoting).encode("utf-8", "surrogateescape")
        return url, headers, body

    def incoming(self, hop, status, headers, text, error=None):
        hop.note["status"] = status
        if error is not None:
            hop.note["error"] = error
        if "worst_case" in hop.note and self.meter is not None:
            try:
                self.meter.after(hop.note, status, text, error, self.s.name)
            except SpendOverrun as exc:  # booked and recorded: the code that sent it ends, with no answer
                raise StopExecution(str(exc)) from None
        sent = self._sent.get(id(hop)) or {}
        headers = {k: put_back_url(v, sent) if k.lower() == "location" else v for k, v in headers.items()}
        cleaned = self.s.scrub({"headers": headers, "text": text}, sent)
        return cleaned["headers"], cleaned["text"]


def _basic_decode(value: str) -> str | None:
    """The decoded credentials of an ``Authorization: Basic`` value, so a placeholder inside is found."""
    if not value[:6].lower() == "basic ":
        return None
    try:
        return base64.b64decode(value[6:].strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
