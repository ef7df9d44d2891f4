"""Wake-up sources: how an idle worker learns that a job may have arrived (ARCHITECTURE §4).

* :class:`Listen` — PostgreSQL ``LISTEN`` on a connection of its own; every enqueue ``NOTIFY``s in its
  transaction, so the signal arrives at commit.
* :class:`CommitMarkerProbe` — where there is no push channel (SQLite): a commit marker (``PRAGMA
  data_version``) read every few milliseconds, lock-free; it moves when another connection committed. Where the
  database is a local file and Linux's inotify is there (:class:`FileWatch`), a write to the database's files
  wakes the probe at once, which then reads the marker until the commit shows (the periodic read stays as the
  fallback, at its idle pace).
* :class:`Polling` — nothing to wait for: the fetcher's polling interval is the only way.

Each is waited on by one thread — the fetcher's own, which claims as soon as its wait ends (no thread in
between to hand the signal on): ``wait(timeout)`` blocks up to ``timeout`` seconds and says whether a signal
came; ``close()``, from any thread, ends the wait in progress at once and every later one.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

logger = logging.getLogger("chokaq.worker")

WakeKind = Literal["listen", "commit_marker", "poll"]

COMMIT_PROBE_INTERVAL = 0.002  # seconds between two reads of the commit marker while work comes and goes
COMMIT_PROBE_IDLE_INTERVAL = 0.005  # … once it has not moved for COMMIT_PROBE_IDLE_AFTER (less CPU when idle)
COMMIT_PROBE_IDLE_AFTER = 0.5  # seconds without a move after which the probe reads at its idle interval
COMMIT_RECHECK_INTERVAL = 0.00025  # seconds between two reads of the marker right after a write to the database's files
COMMIT_RECHECK_FOR = 0.005  # … for this long after the last write (a commit shows in the marker once its WAL frames are in)
RECONNECT_DELAY = 5.0  # seconds without LISTEN after its connection was lost (the worker polls meanwhile)


class WakeSource(Protocol):
    kind: WakeKind

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s; True when new work may have been committed."""
        ...

    def close(self) -> None:
        """Release what the source holds; later waits return False at once."""
        ...


class Polling:
    """No signal: every wait lasts its whole timeout."""

    kind: WakeKind = "poll"

    def __init__(self) -> None:
        self._closed = threading.Event()

    def wait(self, timeout: float) -> bool:
        self._closed.wait(timeout)
        return False

    def close(self) -> None:
        self._closed.set()


class FileWatch:
    """Linux inotify on the directory of a database file: tells when a file of that database (``name``,
    ``name-wal``, ``name-journal``) was written, by any process on this host. Its descriptor is select()-able;
    :meth:`open` returns None where inotify is missing (another OS, a libc without it, no such directory)."""

    IN_MODIFY = 0x00000002
    IN_NONBLOCK = 0o4000
    IN_CLOEXEC = 0o2000000
    _EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name

    def __init__(self, fd: int, prefix: bytes) -> None:
        self.fd = fd
        self.prefix = prefix

    @classmethod
    def open(cls, path: str) -> FileWatch | None:
        directory, name = os.path.split(os.path.abspath(path))
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = int(libc.inotify_init1(cls.IN_NONBLOCK | cls.IN_CLOEXEC))
            if fd < 0:
                return None
            if libc.inotify_add_watch(fd, os.fsencode(directory), cls.IN_MODIFY) < 0:
                os.close(fd)
                return None
        except (OSError, AttributeError):
            logger.debug("no inotify here: the commit marker is read at its pace only", exc_info=True)
            return None
        return cls(fd, os.fsencode(name))

    def fileno(self) -> int:
        return self.fd

    def written(self) -> bool:
        """Take every event already arrived, without waiting: whether one was a write to the database's files."""
        seen = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return seen
            offset = 0
            while offset + self._EVENT.size <= len(data):
                _, _, _, size = self._EVENT.unpack_from(data, offset)
                start = offset + self._EVENT.size
                seen = seen or data[start:start + size].startswith(self.prefix)
                offset = start + size

    def close(self) -> None:
        os.close(self.fd)


class CommitMarkerProbe(Polling):
    """Polls ``read_marker`` (a number that changes whenever another connection commits); the first
    read happens on the waiting thread, whose connection the marker belongs to. It reads every ``interval``
    seconds while the marker moves now and then, every ``idle_interval`` once it has not moved for
    ``idle_after`` seconds (each read costs a statement and a thread wake-up: an idle worker reads less).

    With a ``watch`` (:class:`FileWatch`), a write to the database's files ends the sleep at once; the marker is
    then read every ``recheck`` seconds for ``recheck_for`` seconds (the commit's WAL frames are written before the
    commit shows in the marker), and otherwise at ``idle_interval``: the reads no write prompted are the fallback."""

    kind: WakeKind = "commit_marker"  # a Polling whose wait ends early when the marker moves

    def __init__(self, read_marker: Callable[[], int | None], interval: float = COMMIT_PROBE_INTERVAL,
                 idle_interval: float = COMMIT_PROBE_IDLE_INTERVAL, idle_after: float = COMMIT_PROBE_IDLE_AFTER,
                 watch: FileWatch | None = None, recheck: float = COMMIT_RECHECK_INTERVAL,
                 recheck_for: float = COMMIT_RECHECK_FOR) -> None:
        super().__init__()
        self.watch = watch
        self.recheck = recheck
        self.recheck_for = recheck_for
        self._written_at = float("-inf")
        self._lock = threading.Lock()  # close() from another thread while a wait uses the watch
        self._waiting = False
        self._interrupt = socket.socketpair() if watch is not None else None  # close() writes to [1]
        self.read_marker = read_marker
        self.interval = interval
        self.idle_interval = max(interval, idle_interval)
        self.idle_after = idle_after
        self._last: int | None = None
        self._moved_at = time.monotonic()
        self._started = False

    def pace(self, now: float) -> float:
        """Seconds until the next read: ``interval`` within ``idle_after`` of the last move, else ``idle_interval``;
        with a watch, ``recheck`` within ``recheck_for`` of the last write, else ``idle_interval``."""
        if self.watch is not None:
            return self.recheck if now - self._written_at < self.recheck_for else self.idle_interval
        return self.interval if now - self._moved_at < self.idle_after else self.idle_interval

    def _sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` (a write to the database's files ends it early, with a watch); False once closed."""
        if self._interrupt is None or self.watch is None:
            return not self._closed.wait(seconds)
        with self._lock:
            if self._closed.is_set():
                return False
            self._waiting = True
        try:
            ready, _, _ = select.select([self.watch.fd, self._interrupt[0].fileno()], [], [], seconds)
            if self._closed.is_set():
                return False
            if ready and self.watch.written():
                self._written_at = time.monotonic()
            return True
        finally:
            with self._lock:
                self._waiting = False
                if self._closed.is_set():
                    self._release()

    def close(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            super().close()
            if self._interrupt is not None:
                try:
                    self._interrupt[1].send(b"x")
                except OSError:
                    logger.debug("interrupting the commit marker's wait failed", exc_info=True)
                if not self._waiting:
                    self._release()

    def _release(self) -> None:
        """The watch and the socket pair, once closed and no wait uses them."""
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        for end in self._interrupt or ():
            end.close()

    def _read(self) -> int | None:
        try:
            return self.read_marker()
        except Exception:
            logger.debug("commit marker unavailable", exc_info=True)
            return None

    def wait(self, timeout: float) -> bool:
        if not self._started:
            self._started, self._last = True, self._read()
        now = time.monotonic()
        deadline = now + timeout
        while self._sleep(min(self.pace(now), max(0.0, deadline - now))):
            marker = self._read()
            changed = marker is not None and marker != self._last
            self._last, now = marker, time.monotonic()
            if changed:
                self._moved_at = now
                return True
            if now >= deadline:
                return False
        return False


class Listen:
    """PostgreSQL ``LISTEN`` on ``channel`` (the dialect's ``NOTIFY_CHANNEL``, which enqueue notifies) over an
    autocommit psycopg connection opened with ``params`` (a Django connection's ``get_connection_params()``). A lost connection is logged and
    reopened after :data:`RECONNECT_DELAY`. Through a pooler (``session_pid``, the dialect's, names another
    server process than the one the connection reported) a LISTEN would be registered on whichever pooled
    server session ran it: no LISTEN is sent, and the worker finds new jobs by polling.

    A wait watches the connection's socket and a socket pair of its own (``close()`` writes to it, ending the
    wait at once); one that ends with notifications takes every one already arrived, so a burst of enqueues
    wakes the fetcher once."""

    kind: WakeKind = "listen"

    def __init__(self, params: dict[str, Any], channel: str,
                 session_pid: Callable[[Any], int | None] | None = None) -> None:
        self.channel = channel
        self.session_pid = session_pid
        self.pooled = False
        self.params = {k: v for k, v in params.items() if k not in ("cursor_factory", "context")}
        self._closed = threading.Event()
        self._conn: Any = None
        self._retry_at = 0.0
        self._lock = threading.Lock()  # the connection is closed by the thread using it, or by close()
        self._waiting = False
        self._interrupt = socket.socketpair()  # close() writes to [1]; a wait watches [0]

    def wait(self, timeout: float) -> bool:
        with self._lock:
            if self._closed.is_set():
                return False
            self._waiting = True
        try:
            return self._wait(timeout)
        finally:
            with self._lock:
                self._waiting = False
                if self._closed.is_set():
                    self._release()

    def _wait(self, timeout: float) -> bool:
        pause = self._retry_at - time.monotonic()
        if pause > 0 or self.pooled:
            self._closed.wait(timeout if self.pooled else min(timeout, pause))
            return False
        try:
            if self._conn is None:
                self._conn = self._connect()
            if self._conn is None:  # through a pooler: nothing to listen on
                return self._wait(timeout)
            if self._arrived():
                return True
            ready, _, _ = select.select([self._conn.fileno(), self._interrupt[0]], [], [], timeout)
            return self._interrupt[0] not in ready and bool(ready) and self._arrived()
        except Exception:
            logger.warning("LISTEN connection lost; falling back to polling for %g s", RECONNECT_DELAY,
                           exc_info=True)
            self._disconnect()
            self._retry_at = time.monotonic() + RECONNECT_DELAY
            return False

    def _arrived(self) -> bool:
        """Take every notification already received, without waiting: whether there was one."""
        return bool(list(self._conn.notifies(timeout=0)))

    def _connect(self) -> Any:
        import psycopg  # the [postgres] extra: only a PostgreSQL database gets here

        conn = psycopg.connect(**self.params, autocommit=True)
        if self.session_pid is not None and self.session_pid(conn.cursor()) != conn.info.backend_pid:
            conn.close()
            self.pooled = True
            logger.info("the database connection goes through a pooler, where LISTEN cannot work: this worker finds"
                        " new jobs by polling (WORKER.POLLING_INTERVAL)")
            return None
        conn.execute(f"LISTEN {self.channel}")
        return conn

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                logger.debug("closing the LISTEN connection failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            try:
                self._interrupt[1].send(b"x")
            except OSError:
                logger.debug("interrupting the LISTEN wait failed", exc_info=True)
            if not self._waiting:
                self._release()

    def _release(self) -> None:
        """The connection and the socket pair, once closed and no wait uses them."""
        self._disconnect()
        for end in self._interrupt:
            end.close()
