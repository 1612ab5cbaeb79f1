"""The daemon: what starts wakes, and keeps doing so, in one long-running process.

``scheduler`` is ``brainstem run``: it fires each agent's wakes on an interval
or a cron expression, sweeps for sessions that died with their host and wakes
an agent at once for an urgent message from the operator. ``telegram`` polls
the operator's bot beside it, feeding the inbox. Neither is part of one wake:
they start wakes (:mod:`brainstem.session`). The Bot API's wire itself stays in
:mod:`brainstem.tools.bot_api`, below: a session's tools send with it
(``ctx.send_telegram``).
"""
