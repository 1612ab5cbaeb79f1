"""Brainstem: a timer-woken runtime for autonomous LLM agents."""
__version__ = "0.1.0"
