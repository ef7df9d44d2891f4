"""The worker: small services composed by :class:`Worker` (spec 03; ARCHITECTURE §1–§2).

* ``fetcher`` claims batches (``storage.fetch_batch``) into the bounded prefetch buffer and, when idle, waits
  on the database's wake-up source itself (``storage.wake_source``: LISTEN, SQLite's commit marker, or polling);
* ``dispatcher`` releases rows of paused queues, takes a limiter slot, a circuit permit and the lease;
* ``executor`` runs the handler on a pool thread and decides the outcome with ``policy``;
* ``completer`` commits finished jobs in batches;
* ``supervisor`` keeps running jobs alive, enforces timeouts and cancel requests, writes the registry
  row, and runs the rescue sweep; ``control`` applies the Deck's commands.

It knows no SQL, no driver and no HTTP: every database touch is a ``storage`` call.
"""

from chokaq_core.worker.limits import Limiter, PrefetchBuffer
from chokaq_core.worker.process import Worker, WorkerOptions, new_worker_id

__all__ = ["Limiter", "PrefetchBuffer", "Worker", "WorkerOptions", "new_worker_id"]
