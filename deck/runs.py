"""Bulk runs: an operator's confirmed "all matching" command (cancel every Active match, requeue or purge every
DLQ match), carried out by the web process batch by batch.

Where the loop runs, and why: in a background thread of the web process that took the confirmation, not in
the browser looping over batch requests with a cursor. Once the operator has confirmed, the run belongs to the
server: closing the tab, a reload or a dropped connection cannot stop it halfway with nobody recording how far
it got. Each batch (≤ ``service.BULK_BATCH`` rows) is its own short transaction, so no lock on Hot outlives a
batch and an interrupted run leaves only whole batches done. The run has ONE audit entry: written when it
starts and rewritten after every committed batch with the count so far, so at any moment it states what has
really been done (if the web process dies mid-run, the entry keeps the last committed count and says
"running … so far"; it never claims the whole set). Progress travels as ``BulkProgress`` events by the same
road as every other event (after commit; across processes with Redis) and operator tabs show it as a toast,
"Cancelled 12,500 / 27,000". A run of one batch or less finishes inside the request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from chokaq_core import events, service
from deck.models import BULK_MEMBER_SCOPE, OperatorAction

logger = logging.getLogger("chokaq.deck")

Work = Callable[[service.Progress | None], tuple[list[str], list[str]]]  # on_batch → (ids done, ids flagged)

RUNNING: dict[int, threading.Thread] = {}  # audit entry id → the thread carrying that run out (tests join them)


@dataclass(frozen=True)
class Run:
    """One confirmed bulk-by-filter command: its name (the view's), who asked, the verb its messages use
    ("Cancelled"), how many rows matched when it was confirmed, and the work itself."""

    command: str
    actor: str
    verb: str
    total: int
    work: Work

    def message(self, done: int, flagged: int = 0, *, running: bool = False, total: int | None = None) -> str:
        text = f"{self.verb} {done - flagged:,} / {max(total or self.total, done):,} matching job(s)"
        if flagged:
            text += f" and asked {flagged:,} running one(s) to stop"
        return f"{text} — running in batches of {service.BULK_BATCH}, so far" if running else text

    @property
    def inline(self) -> bool:
        return self.total <= service.BULK_BATCH


def start(run: Run, entry_id: int) -> None:
    """Carry ``run`` out in a background thread; its audit entry ``entry_id`` already exists."""
    thread = threading.Thread(target=_carry_out, args=(run, entry_id), name=f"chokaq-deck-run-{entry_id}",
                              daemon=True)
    RUNNING[entry_id] = thread
    thread.start()


def _carry_out(run: Run, entry_id: int) -> None:
    db = OperatorAction.objects.db
    state = {"done": 0, "total": run.total}

    def report(done: int, total: int, *, finished: bool, level: str, message: str) -> None:
        OperatorAction.objects.filter(id=entry_id).update(message=message, level=level)
        events.publish([events.bulk_progress(entry_id, run.command, done, total, finished=finished, level=level,
                                             message=message)], using=db)

    def on_batch(ids: list[str], done: int, total: int) -> None:
        state.update(done=done, total=total)
        OperatorAction.objects.bulk_create(
            [OperatorAction(actor=run.actor, command=run.command, scope=f"{BULK_MEMBER_SCOPE}{entry_id}", job_id=i,
                            level="info", message=f"{run.verb} by bulk action #{entry_id}") for i in ids],
            batch_size=500)
        report(done, total, finished=False, level="info",
               message=run.message(done, running=True, total=total))

    try:
        done, flagged = run.work(on_batch)
        n = len(done) + len(flagged)
        report(n, max(state["total"], n), finished=True, level="success" if n else "warning",
               message=run.message(n, len(flagged), total=state["total"]))
        log = logger.warning if "purge" in run.command else logger.info
        log("%s by %s finished: %s", run.command, run.actor, run.message(n, len(flagged)))
    except Exception as exc:  # the batches committed so far stay done; the entry says where it stopped
        logger.exception("%s by %s stopped after %s row(s)", run.command, run.actor, state["done"])
        report(state["done"], state["total"], finished=True, level="error",
               message=f"{run.message(state['done'], total=state['total'])} — stopped: {exc}")
    finally:
        RUNNING.pop(entry_id, None)
        connections.close_all()


def wait_all(timeout: float = 60) -> None:
    """Wait for every run of this process to end (tests, and a graceful shutdown)."""
    for thread in list(RUNNING.values()):
        thread.join(timeout)
