"""``python manage.py chokaq_health [--tags sql,live] [--host [NAME]]`` for container probes.

Prints the report as JSON; exits 0 when Healthy or Degraded, 1 when Unhealthy.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from chokaq_core import health


class Command(BaseCommand):
    help = "Run ChokaQ's health checks (chokaq_sql, chokaq_worker, chokaq_queue_saturation)."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tags", default="", help="comma-separated tags: only checks carrying one of them")
        parser.add_argument("--host", nargs="?", const=socket.gethostname(), default=None,
                            help="judge only the workers of this host (default with no value: this machine)")

    def handle(self, *args: Any, **options: Any) -> None:
        tags = [t for t in options["tags"].split(",") if t.strip()]
        report = health.run(tags, host=options["host"])
        self.stdout.write(json.dumps(report.as_dict(), indent=2))
        self.stdout.flush()
        sys.exit(report.exit_code)
