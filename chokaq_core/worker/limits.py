"""Flow control between the worker's services: the concurrency limiter, the prefetch buffer and the
count of rows in flight (spec 03 §3–§4)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

from chokaq_core.domain import HotJob

AHEAD_WAIT = 0.02  # seconds: how long, by recent executions, a row leased ahead waits for an executor
PACE_WEIGHT = 0.2  # the weight of the latest execution in the running mean of execution times


class Limiter:
    """Dynamic concurrency limiter (spec 03 §4) built on a Condition: ``capacity`` handlers run at once.

    Leasing ahead: while executions are short, up to ``ahead`` more rows may be leased than there are executors,
    so that a freed executor finds its next job leased already instead of waiting on a lease round trip. ``ahead``
    follows the running mean of execution times (:meth:`pace`): as many rows as the executors finish in
    ``AHEAD_WAIT``, at most ``most_ahead``; none while executions are long or not measured yet."""

    def __init__(self, capacity: int, maximum: int, most_ahead: int = 0) -> None:
        self.maximum = maximum
        self.capacity = max(1, min(capacity, maximum))
        self.most_ahead = most_ahead
        self.ahead = 0
        self.running = 0
        self._mean: float | None = None
        self._closed = False
        self._cond = threading.Condition()

    def pace(self, seconds: float) -> None:
        """One execution took ``seconds``: how far ahead leases may run follows."""
        with self._cond:
            self._pace(seconds)

    def _pace(self, seconds: float) -> None:
        mean = seconds if self._mean is None else self._mean + PACE_WEIGHT * (seconds - self._mean)
        self._mean = mean
        ahead = min(self.most_ahead, int(self.capacity * AHEAD_WAIT / max(mean, 1e-6)))
        if ahead > self.ahead:
            self._cond.notify(ahead - self.ahead)
        self.ahead = ahead

    def acquire(self, timeout: float | None = None) -> bool:
        with self._cond:
            ok = self._cond.wait_for(lambda: self._closed or self.running < self.capacity + self.ahead, timeout)
            if not ok or self._closed:
                return False
            self.running += 1
            return True

    def release(self, ran: float | None = None) -> None:
        """A slot freed; ``ran``: the seconds of the execution that held it, for :meth:`pace` (one lock for both)."""
        with self._cond:
            if self.running <= 0:
                self.running = 0
                raise RuntimeError("limiter released without a matching acquire")
            if ran is not None:
                self._pace(ran)
            self.running -= 1
            self._cond.notify()  # one slot freed: one waiter can take it

    def set_capacity(self, capacity: int) -> None:
        with self._cond:
            self.capacity = max(1, min(capacity, self.maximum))
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class PrefetchBuffer:
    """Bounded FIFO between fetcher and dispatcher (spec 03 §3). Two conditions over one lock: a row put wakes
    one taker, a row taken wakes the fetcher waiting for room (never every waiting thread)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: collections.deque[HotJob] = collections.deque()
        self._lock = threading.Lock()
        self._filled = threading.Condition(self._lock)  # rows arrived (or closed)
        self._emptied = threading.Condition(self._lock)  # room freed (or closed)
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def free(self) -> int:
        return self.capacity - len(self._items)

    def wait_for_space(self, timeout: float, room: int = 1) -> bool:
        """Wait until ``room`` more rows fit (at most the capacity) or the buffer is closed."""
        room = max(1, min(room, self.capacity))
        with self._lock:
            return self._emptied.wait_for(lambda: self._closed or self.capacity - len(self._items) >= room, timeout)

    def put_many(self, jobs: Sequence[HotJob]) -> None:
        with self._lock:
            self._items.extend(jobs)
            self._filled.notify(len(jobs))

    def get(self, timeout: float) -> HotJob | None:
        with self._lock:
            if not self._items and not self._filled.wait_for(lambda: self._closed or bool(self._items), timeout):
                return None
            if not self._items:
                return None
            job = self._items.popleft()
            self._emptied.notify()
            return job

    def drain(self) -> list[HotJob]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._emptied.notify_all()
            return items

    def take_queues(self, queues: set[str]) -> list[HotJob]:
        """Remove and return the buffered rows of ``queues`` (the others keep their order)."""
        if not queues:
            return []
        with self._lock:
            taken = [j for j in self._items if j.queue in queues]
            if taken:
                self._items = collections.deque(j for j in self._items if j.queue not in queues)
                self._emptied.notify_all()
            return taken

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._filled.notify_all()
            self._emptied.notify_all()


class InFlight:
    """Rows claimed by the fetcher and not yet finished (released, refused or executed)."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self._count += n

    def done(self, n: int = 1) -> None:
        with self._lock:
            self._count -= n

    def __bool__(self) -> bool:
        with self._lock:
            return self._count > 0
