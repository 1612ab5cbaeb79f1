"""Command modules split out of cli.py, each adding one command to the ``brainstem`` group."""
