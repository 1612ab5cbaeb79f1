"""Fixtures for the tools' tests."""

from __future__ import annotations

import pytest

from tests.wake_helpers import seeded


@pytest.fixture
def store(url):
    """A seeded SQLite store on disk, without a soul (at ``url``)."""
    s = seeded(url, soul=False)
    yield s
    s.close()
