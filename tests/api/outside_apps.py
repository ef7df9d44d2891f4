"""A module outside every installed app: no stored ``django.task:`` type key may make a process import it."""

from __future__ import annotations

from django.tasks import task


@task
def planted() -> str:
    return "ran code outside the installed apps"
