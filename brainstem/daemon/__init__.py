"""The daemon: what starts wakes, and keeps doing so, in one long-running process.

``scheduler`` is ``brainstem run``: it fires each agent's wakes on an interval
or a cron expression; ``wakes`` finds, from the store's wake index, the
sessions that died with their host and the urgent messages from the operator,
and wakes their agents at once; ``schedules`` runs the agents' scheduled
actions beside their sessions. ``telegram`` polls
the operator's bot beside it, feeding the inbox. Neither is part of one wake:
they start wakes (:mod:`brainstem.session`). The Bot API's wire itself stays in
:mod:`brainstem.tools.bot_api`, below: a session's tools send with it
(``ctx.send_telegram``).
"""
