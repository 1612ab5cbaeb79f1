"""What the operator touches: the command line, the dashboard, metrics and status.

``cli`` is the ``brainstem`` command group, built from one module per command
group in ``commands``; ``output`` prints tables and JSON the same way
everywhere; ``status`` gathers and renders the agent's state; ``dashboard``
serves it in a browser; ``metrics`` exposes it to Prometheus; ``demo`` is
the offline first run.
"""
