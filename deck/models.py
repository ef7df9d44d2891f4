"""The Deck's own tables: the permission holder and the operator audit log.

``Deck`` is unmanaged (no table): it only carries the three permissions of
the ``deck`` app that ``chokaq_roles`` hands to the Deck groups.
``OperatorAction`` records every command an operator ran (who, when, what,
the outcome) and, for payload edits, the payload before and after — the
inspector shows what changed and the system console shows the latest entries.
"""

from __future__ import annotations

from django.db import models


class Deck(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_deck", "Can view the Deck (pages, panels, live updates)"),
            ("operate_deck", "Can cancel, retry, edit jobs and control queues from the Deck"),
            ("admin_deck", "Can purge and run bulk-by-filter operations from the Deck"),
        ]


class OperatorAction(models.Model):
    LEVELS = ("info", "success", "warning", "error")

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=150)
    command = models.CharField(max_length=64)
    scope = models.CharField(max_length=1000, blank=True, default="")
    job_id = models.CharField(max_length=50, null=True, db_index=True)
    level = models.CharField(max_length=10, default="info")
    message = models.TextField()
    previous_payload = models.TextField(null=True)
    new_payload = models.TextField(null=True)

    class Meta:
        db_table = "chokaq_deck_actions"
        default_permissions = ()
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.actor} {self.command} {self.scope}"


BULK_MEMBER_SCOPE = "bulk #"  # scope of the per-job entries of a bulk command: "bulk #<id of the command entry>"


def console_actions() -> models.QuerySet[OperatorAction]:
    """The entries the system console shows: every command once (not the per-job entries of a bulk command)."""
    return OperatorAction.objects.exclude(scope__startswith=BULK_MEMBER_SCOPE)
