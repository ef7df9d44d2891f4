"""An app's Django ``@task`` module that nothing imports: only autodiscovery loads it."""

from __future__ import annotations

from django.tasks import task


@task
def shout(word: str) -> str:
    return word.upper()
