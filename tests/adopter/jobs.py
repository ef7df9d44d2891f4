"""An app's ``@job`` module that no URLconf, view or setting imports: only autodiscovery loads it."""

from __future__ import annotations

from chokaq_core import JobContext, job


@job("adopter.ping.v1")
def ping(ctx: JobContext, word: str = "pong") -> str:
    return word
