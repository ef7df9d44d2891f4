"""Handlers that end their thread the hard way: ``SystemExit`` and ``KeyboardInterrupt``, as a plain
``@job`` and as a Django ``@task`` (the worker subprocess loads this module through ``JOB_MODULES``)."""

from __future__ import annotations

import sys

from django.tasks import task

from chokaq_core import JobContext, job


@job("test.exit.system.v1")
def system_exit_job(ctx: JobContext) -> None:
    sys.exit(3)


@job("test.exit.interrupt.v1")
def interrupt_job(ctx: JobContext) -> None:
    raise KeyboardInterrupt("interrupted by the handler")


@task
def system_exit_task() -> None:
    sys.exit("task asked the process to exit")


@task
def interrupt_task() -> None:
    raise KeyboardInterrupt
