"""Agent-written code the runtime runs in the sandbox: tools and LLM adapters.

``services`` loads a tool's code and meta, grants it what its meta asks and
the operator allows (``ToolPolicy``), serves its ``ctx`` (``ToolServices``)
and runs it (``run_tool``); ``adapters`` turns ``provider:*`` code into a
tier of the LLM cascade.
"""
