"""The worker's threads: named daemons, each closing its own database connections when it ends."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

logger = logging.getLogger("chokaq.worker")


def start_thread(name: str, target: Callable[[], None]) -> threading.Thread:
    """Run ``target`` on a new daemon thread; a crash is logged, the thread's connections are closed."""
    thread = threading.Thread(target=_main, args=(target,), name=name, daemon=True)
    thread.start()
    return thread


def _main(target: Callable[[], None]) -> None:
    try:
        target()
    except Exception:
        logger.exception("worker thread %s crashed", threading.current_thread().name)
    finally:
        connections.close_all()
