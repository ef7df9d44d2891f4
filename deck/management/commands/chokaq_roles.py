"""``python manage.py chokaq_roles``: create (or repair) the three Deck groups.

* Deck viewers   — deck.view_deck: every page, panel and the live updates.
* Deck operators — + deck.operate_deck: cancel, retry/resurrect, edit, pause/resume, queue limits.
* Deck admins    — + deck.admin_deck: purges and bulk-by-filter operations.

Idempotent: each group ends up with exactly its permissions. ``--add USER=GROUP``
puts a user into a group (``viewers``, ``operators`` or ``admins``).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand, CommandError, CommandParser

from deck.permissions import GROUPS

SHORT = {"viewers": "Deck viewers", "operators": "Deck operators", "admins": "Deck admins"}


class Command(BaseCommand):
    help = "Create the Deck groups (viewers, operators, admins) with their permissions."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--add", action="append", default=[], metavar="USER=GROUP",
                            help="add a user to a group: viewers, operators or admins (repeatable)")

    def handle(self, *args: Any, **options: Any) -> None:
        perms = {p.codename: p for p in Permission.objects.filter(content_type__app_label="deck")}
        missing = {c for codes in GROUPS.values() for c in codes} - set(perms)
        if missing:
            raise CommandError(f"missing deck permissions {sorted(missing)}: run `manage.py migrate` first")
        for name, codes in GROUPS.items():
            group, created = Group.objects.get_or_create(name=name)
            group.permissions.set([perms[c] for c in codes])
            if options["verbosity"]:
                self.stdout.write(f"{'created' if created else 'updated'} group {name!r}: {', '.join(codes)}")
        users = get_user_model()
        for item in options["add"]:
            username, _, short = item.partition("=")
            if short not in SHORT:
                raise CommandError(f"--add {item!r}: group must be one of {', '.join(SHORT)}")
            try:
                user = users.objects.get_by_natural_key(username)
            except users.DoesNotExist:
                raise CommandError(f"--add {item!r}: no user {username!r}") from None
            user.groups.add(Group.objects.get(name=SHORT[short]))
            self.stdout.write(f"added {username!r} to {SHORT[short]!r}")
