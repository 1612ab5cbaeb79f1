"""What every command shares: the settings and the store, each opened on first use.

The ``brainstem`` group puts one :class:`Ctx` on the click context; commands
take it with :data:`pass_ctx`. Opening nothing up front keeps ``--help`` and
the commands that need no store from paying for settings or a connection.
"""

from __future__ import annotations

import click


class Ctx:
    """What every command shares: settings and the store, opened on first use."""

    def __init__(self, debug: bool):
        self.debug = debug
        self._settings = None
        self._store = None

    @property
    def settings(self):
        if self._settings is None:
            from brainstem.core.settings import load_settings

            self._settings = load_settings()
        return self._settings

    @property
    def store(self):
        if self._store is None:
            from brainstem.store import open_store

            # Only `brainstem seed` and `agents register` make an agent exist (they register it themselves).
            self._store = open_store(self.settings.kv, prefix=self.settings.prefix, register=False)
        return self._store


pass_ctx = click.make_pass_decorator(Ctx)
