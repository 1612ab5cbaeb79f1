"""The agent as its store holds it, and the only view through which it writes.

``config`` (the agent's defaults and models), ``seed``, ``versions`` (every
change, for history and rollback), ``reflexes``, ``review`` (what waits for
the operator), ``refusals``, ``history`` (one summary per session),
``memory``, ``budget`` (spend today), ``schedules`` (scheduled actions: one tool at set
times, and what the agent may schedule), ``sleep`` (is the agent asleep? kept
light for the wake path), ``approval`` (the code the operator approved, by its bytes) and
``guarded`` (``AgentKV``: every write the agent makes, checked).
"""
