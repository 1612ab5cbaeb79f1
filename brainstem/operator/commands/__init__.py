"""The ``brainstem`` commands, one module per command group or closely related set of commands.

Each module defines click commands and nothing registers them but ``cli.py``;
none imports ``cli.py``. They share :mod:`.context` (settings and the store)
and print through :mod:`brainstem.operator.output`.
"""
