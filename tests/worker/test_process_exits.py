"""A handler that raises ``SystemExit`` or ``KeyboardInterrupt`` fails like any other fatal error: its job
ends in the DLQ with the error (a Django task result reads FAILED) and the worker process keeps running."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chokaq_core import FailureReason, enqueue
from tests.worker.exits import interrupt_task, system_exit_task
from tests.worker.test_command import BANNER, ROOT, _env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


JOB_MODULES = ["tests.jobs", "tests.worker.exits"]  # a django.task: key resolves only inside these (or an app)


def test_system_exit_and_keyboard_interrupt_dead_letter_the_job_and_the_worker_keeps_running(
        state: Any, tmp_path: Path, chokaq_settings: Any) -> None:
    chokaq_settings.CHOKAQ = {**chokaq_settings.CHOKAQ, "JOB_MODULES": JOB_MODULES}
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    env = _env()
    env["CHOKAQ_TEST_OVERRIDES"] = json.dumps({**json.loads(env["CHOKAQ_TEST_OVERRIDES"]), "JOB_MODULES": JOB_MODULES})
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "manage.py", "chokaq_worker", "--concurrency", "1"], cwd=ROOT,
                                env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)

    def output() -> str:
        return f"rc={proc.poll()}\n{out.read_text(errors='replace')}\n{err.read_text(errors='replace')[-4000:]}"

    try:
        state.wait(lambda: BANNER.search(out.read_text()) or proc.poll() is not None, "the banner", timeout=30)
        assert proc.poll() is None, output()
        jobs = {"SystemExit": enqueue("test.exit.system.v1", {}),
                "KeyboardInterrupt": enqueue("test.exit.interrupt.v1", {})}
        tasks = {"SystemExit": system_exit_task.enqueue(), "KeyboardInterrupt": interrupt_task.enqueue()}
        after = enqueue("test.ok.v1", {})

        for name, job_id in [*jobs.items(), *((name, result.id) for name, result in tasks.items())]:
            dead = state.wait_dead(job_id, timeout=30)
            assert dead.failure_reason == FailureReason.FATAL_ERROR, output()
            assert name in (dead.error_details or ""), dead.error_details
        state.wait_archived(after, timeout=30)  # the (single) executor thread survived all four
        for name, result in tasks.items():
            done = result.task.get_result(result.id)
            assert done.status == "FAILED"
            assert done.errors and done.errors[-1].exception_class_path == f"builtins.{name}"
        assert proc.poll() is None, output()

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, output()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
