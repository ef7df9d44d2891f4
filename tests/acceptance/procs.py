"""Helpers shared by the chaos and database-restart acceptance tests: worker/web subprocesses and results.

Each process writes its stdout/stderr into files under the test's ``tmp_path``; ``output()`` returns
their tails for failure messages. ``write_result`` stores a scenario's figures as JSON in
``$CHOKAQ_RELIABILITY_DIR`` (set by ``bench/reliability_report.py``); without it nothing is written.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BANNER = re.compile(r"ChokaQ worker (\S+) \|")


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    worker_id: str = ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self, tail: int = 4000) -> str:
        text = [f"--- {self.name} {self.worker_id or ''} pid {self.proc.pid} rc {self.proc.poll()}"]
        for path in (self.stdout, self.stderr):
            try:
                text.append(path.read_text(errors="replace")[-tail:])
            except OSError:
                pass
        return "\n".join(text)

    def banner_id(self) -> str:
        """The worker id from the banner, once printed ('' before)."""
        if not self.worker_id:
            try:
                match = BANNER.search(self.stdout.read_text(errors="replace"))
            except OSError:
                match = None
            if match:
                self.worker_id = match.group(1)
        return self.worker_id


def spawn(name: str, argv: list[str], env: Mapping[str, str], tmp_path: Path) -> Proc:
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(argv, cwd=ROOT, env=dict(env), stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL)
    return Proc(name, proc, out, err)


def spawn_worker(name: str, env: Mapping[str, str], tmp_path: Path) -> Proc:
    return spawn(name, [sys.executable, "manage.py", "chokaq_worker"], env, tmp_path)


def wait_banners(workers: Iterable[Proc], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for worker in workers:
        while not worker.banner_id():
            if not worker.alive() or time.monotonic() > deadline:
                pytest.fail("a worker did not print its banner:\n" + worker.output())
            time.sleep(0.05)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, procs: Iterable[Proc] = ()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}:\n" + "\n".join(p.output() for p in procs))


def reap(procs: Iterable[Proc]) -> None:
    """SIGKILL whatever still runs (only the processes these tests started) and wait for them."""
    procs = list(procs)
    for p in procs:
        if p.alive():
            try:
                p.proc.kill()
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def stop_gracefully(procs: Iterable[Proc], timeout: float = 30.0) -> None:
    """SIGTERM, then every process must exit 0 within ``timeout``."""
    procs = [p for p in procs if p.alive()]
    for p in procs:
        p.proc.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            code = p.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{p.name} did not stop on SIGTERM:\n" + p.output())
        assert code == 0, p.output()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, "") or default)


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, "") or default)


def write_result(name: str, result: dict[str, Any]) -> None:
    target = os.environ.get("CHOKAQ_RELIABILITY_DIR")
    if not target:
        return
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.json").write_text(json.dumps(result, indent=2, sort_keys=True))
