"""Agent-written code the runtime runs in the sandbox: tools and LLM adapters.

``tool`` reads a tool's code and meta from the store; ``policy`` is what the
operator allows such code (``ToolPolicy``); ``services`` grants it what its
meta asks and the policy allows, serves its ``ctx`` (``ToolServices``) and runs
it (``run_tool``); ``adapters`` turns ``provider:*`` code into a tier of the
LLM cascade.
"""
