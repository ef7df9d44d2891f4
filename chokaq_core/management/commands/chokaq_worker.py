"""``python manage.py chokaq_worker``: run a ChokaQ worker (the loop lives in chokaq_core.worker)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from django.core.checks import Tags
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chokaq_core import health, storage
from chokaq_core.checks import ENGINE_TAG
from chokaq_core.heap import limit_malloc_arenas, release_free_heap
from chokaq_core.worker import Worker, WorkerOptions

METRICS_PORT_OFFSET = "CHOKAQ_METRICS_PORT_OFFSET"  # set by --processes for each child


class Command(BaseCommand):
    help = "Run a ChokaQ worker: claim jobs, execute handlers, record outcomes."
    # The checks a worker needs (the engine's settings and drivers, the models), not the web process's: a worker
    # serves no URL and no websocket, and checking their wiring would import the Deck and the project's views.
    # ``manage.py check`` (or any web process's start) runs them all; ``--skip-checks`` skips these too.
    requires_system_checks = [ENGINE_TAG, Tags.models]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", default="", help="comma-separated queues to fetch from (default: all)")
        parser.add_argument("--concurrency", type=int, default=None, help="handler threads per process")
        parser.add_argument("--processes", type=int, default=1, help="worker processes to run")
        parser.add_argument("--batch-size", type=int, default=None, help="rows claimed per fetch")
        parser.add_argument("--burst", action="store_true", help="process everything eligible now, then exit 0")
        parser.add_argument("--worker-id", default=None, help="explicit worker id (single process only)")
        parser.add_argument("--no-rescue", action="store_true", help="do not run the zombie/abandoned sweep here")
        parser.add_argument("--metrics-port", type=int, default=None,
                            help="serve Prometheus metrics on this port (with --processes P: ports N..N+P-1)")

    def execute(self, *args: Any, **options: Any) -> Any:
        """Give back, before the checks run, the heap that loading the project freed (the compile of modules):
        otherwise the process keeps that high-water mark until ``handle`` trims."""
        release_free_heap()
        return super().execute(*args, **options)

    def handle(self, *args: Any, **options: Any) -> None:
        processes = options["processes"]
        if processes < 1:
            raise CommandError("--processes must be >= 1")
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise CommandError("--concurrency must be >= 1")
        if options["batch_size"] is not None and options["batch_size"] < 1:
            raise CommandError("--batch-size must be >= 1")
        if processes > 1:
            if options["worker_id"]:
                raise CommandError("--worker-id cannot be combined with --processes > 1")
            sys.exit(self._supervise_children(processes))
        limit_malloc_arenas()
        self._check_schema()
        queues = [q.strip() for q in options["queues"].split(",") if q.strip()] or None
        worker = Worker(WorkerOptions(
            queues=queues, concurrency=options["concurrency"], batch_size=options["batch_size"],
            burst=options["burst"], rescue=not options["no_rescue"], worker_id=options["worker_id"],
        ))
        if options["metrics_port"] is not None:
            self._serve_metrics(options["metrics_port"])
        self.stdout.write(worker.banner())
        self.stdout.flush()
        self._install_signals(worker)
        storage.dialect()  # the vendor's dialect module, compiled where no .pyc is kept: before the heap is trimmed
        release_free_heap()
        sys.exit(worker.run())

    def _check_schema(self) -> None:
        """Spec 05 §6: the chokaq_sql check first; a missing schema exits non-zero with log 5002."""
        result = health.check_sql()
        if result.status == health.Status.UNHEALTHY:
            logging.getLogger("chokaq.worker").error("ChokaQ storage is not ready (5002): %s", result.description)
            raise CommandError(f"{result.description}")

    def _serve_metrics(self, port: int) -> None:
        port += int(os.environ.get(METRICS_PORT_OFFSET, "0"))
        if not 0 < port < 65536:
            raise CommandError(f"--metrics-port must give ports within 1..65535 (got {port})")
        from chokaq_core import prometheus  # the exposition (prometheus_client, an HTTP server): only when served

        prometheus.serve(port)
        self.stdout.write(f"Prometheus metrics on :{port}/metrics")

    def _install_signals(self, worker: Worker) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        signals_seen = 0

        def on_signal(signum: int, frame: Any) -> None:
            nonlocal signals_seen
            signals_seen += 1
            if signals_seen > 1:
                os._exit(1)  # second signal: stop waiting for the grace period
            worker.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def _supervise_children(self, processes: int) -> int:
        """Run N single-process workers and forward SIGTERM/SIGINT to them."""
        argv = [sys.executable, sys.argv[0], "chokaq_worker"]
        skip_next = False
        for arg in sys.argv[2:]:
            if skip_next:
                skip_next = False
                continue
            if arg == "--processes":
                skip_next = True
                continue
            if arg.startswith("--processes="):
                continue
            argv.append(arg)
        children = [subprocess.Popen(argv, env={**os.environ, METRICS_PORT_OFFSET: str(i)}) for i in range(processes)]

        def forward(signum: int, frame: Any) -> None:
            for child in children:
                if child.poll() is None:
                    child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        codes = [child.wait() for child in children]
        return max(codes, default=0)
