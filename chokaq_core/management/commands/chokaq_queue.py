"""``python manage.py chokaq_queue pause|resume|hide|show QUEUE``, ``set QUEUE --max-workers N --zombie-timeout S``
and rate limits: ``set QUEUE --rate 100/m`` (``0/m`` pauses, ``none`` lifts, ``reset`` returns to the declared rate;
``--type KEY`` for a job type's limit instead of the queue's)."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from chokaq_core import service


class Command(BaseCommand):
    help = "Control a queue: pause, resume, hide, show, or set its max workers / zombie timeout."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume", "hide", "show", "set", "list"])
        parser.add_argument("queue", nargs="?", default="")
        parser.add_argument("--max-workers", default=None,
                            help="fleet-wide cap on running jobs of the queue (1-10000; 'none' clears)")
        parser.add_argument("--zombie-timeout", default=None,
                            help="seconds without heartbeat before a running job is a zombie (1-86400; 'none' clears)")
        parser.add_argument("--rate", default=None,
                            help="fleet-wide rate limit: '100/m', '50/s burst 10', '1000/h'; '0/m' pauses, 'none' "
                                 "lifts, 'reset' returns to the declared rate")
        parser.add_argument("--type", default=None, dest="type_key",
                            help="with --rate: the limit of this job type (QUEUE may then be omitted)")

    def handle(self, *args: Any, **options: Any) -> None:
        action, queue = options["action"], options["queue"]
        if action == "list":
            for state in service.queue_states():
                self.stdout.write(
                    f"{state.name}\tpaused={state.is_paused}\tactive={state.is_active}\t"
                    f"max_workers={state.max_workers or '-'}\tzombie_timeout={state.zombie_timeout_seconds or '-'}"
                )
            for limit in service.rate_limits():
                rate = limit.rate
                self.stdout.write(f"{limit.name}\trate={rate.text if rate else 'lifted' if limit.lifted else '-'}"
                                  f"\tused={limit.used}/{rate.count if rate else '-'}")
            return
        actor = f"shell:{_os_user()}"
        if action == "set" and options["rate"] is not None and options["type_key"]:
            self._set_rate(f"type:{options['type_key']}", options["rate"], actor)
            return
        if not queue:
            raise CommandError(f"{action} needs a QUEUE")
        try:
            if action in ("pause", "resume"):
                service.set_queue_paused(queue, action == "pause")
                self._audit("set_queue_paused", actor, queue, service.paused_change(action == "pause"))
            elif action in ("hide", "show"):
                if not service.set_queue_active(queue, action == "show"):
                    raise CommandError(f"queue {queue!r} does not exist")
                self._audit("set_queue_active", actor, queue, service.active_change(action == "show"))
            else:
                if options["max_workers"] is None and options["zombie_timeout"] is None and options["rate"] is None:
                    raise CommandError("set needs --max-workers, --zombie-timeout and/or --rate")
                if options["rate"] is not None:
                    self._set_rate(f"queue:{queue}", options["rate"], actor)
                if options["max_workers"] is not None:
                    value = service.set_queue_max_workers(queue, _none(options["max_workers"]))
                    self._audit("set_queue_max_workers", actor, queue, service.max_workers_change(value))
                if options["zombie_timeout"] is not None:
                    value = service.set_queue_zombie_timeout(queue, _none(options["zombie_timeout"]))
                    self._audit("set_queue_zombie_timeout", actor, queue, service.zombie_timeout_change(value))
        except service.ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"queue {queue}: {action} done")

    @staticmethod
    def _audit(command: str, actor: str, queue: str, change: str) -> None:
        """A queue change from the shell, in the audit log under the Deck's own command name and wording."""
        service.record_command(command, actor=actor, scope=queue, message=service.queue_change(queue, change))

    def _set_rate(self, name: str, rate: str, actor: str) -> None:
        """Set, pause (0/…), lift ('none') or reset ('reset') one limit, by the same service verbs as the Deck,
        audited as the Deck audits them (actor ``shell:<os user>``); what is in force is printed."""
        value = rate.strip().lower()
        try:
            if value in ("none", "lift", "off"):
                command, change = "lift_rate_limit", "lifted"
                state = service.lift_rate_limit(name, actor=actor)
            else:
                command, change = "set_rate_limit", ("reset to the declared rate" if value == "reset"
                                                     else f"set to {rate.strip()}")
                state = service.set_rate_limit(name, None if value == "reset" else rate, actor=actor)
        except service.ServiceError as exc:
            raise CommandError(str(exc)) from exc
        service.record_command(command, actor=actor, scope=state.name,
                               message=service.rate_limit_change(state, change))
        self.stdout.write(f"rate limit {state.name}: {state.rate.text if state.rate else 'none'}")


def _os_user() -> str:
    """Who runs the shell (the audit's actor), "unknown" when the system cannot say."""
    try:
        return getpass.getuser() or "unknown"
    except (KeyError, OSError):
        return "unknown"


def _none(value: str) -> str | None:
    return None if value.strip().lower() in ("none", "null", "") else value
