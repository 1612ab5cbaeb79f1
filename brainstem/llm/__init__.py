"""LLM calls: providers, prices, the meter and the one chokepoint every call goes through.

``openrouter`` is the hard-coded client nothing can break, ``providers`` the
cascade's tiers, ``pricing`` and ``meter`` what a call costs and how the
ceiling is held, ``chokepoint`` the ``LLM`` object a session calls, and
``cassette`` recorded answers for offline runs.
"""
