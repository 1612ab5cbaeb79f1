"""The bottom layer: what every other layer shares, with no I/O of its own.

Names of store keys (``keys``), the plan format (``plan``), karma event names
(``events``), outcomes, errors, the clock (``clock``) and when a schedule runs
(``recurrence``: every and cron, across daylight saving), operator settings read
from the environment (``settings``, ``environment``), secret bindings and the
scrubber that keeps secret text out of everything the agent sees, and the
marking of untrusted text before it reaches a prompt (``untrusted``,
``sanitize``, ``templates``).
"""
