"""An app's Django ``@task`` module that nothing imports: only autodiscovery loads it."""

from __future__ import annotations

from django.tasks import TaskContext, task


@task
def shout(word: str) -> str:
    return word.upper()


SEEN_RESULTS: list[tuple[int, list[str], int]] = []  # (context attempt, worker ids, errors) per execution
FAILURES_LEFT: dict[str, int] = {}


@task
def always_down(key: str) -> None:
    """A transient failure on every attempt: the retries run out."""
    raise ConnectionError(f"payment gateway timeout ({key})")


@task(takes_context=True)
def fails_then_sees_context(context: TaskContext, key: str, failures: int) -> list[str]:
    """Records what its context says, then fails transiently ``failures`` times before succeeding."""
    result = context.task_result
    SEEN_RESULTS.append((context.attempt, list(result.worker_ids), len(result.errors)))
    left = FAILURES_LEFT.setdefault(key, failures)
    if left:
        FAILURES_LEFT[key] = left - 1
        raise ConnectionError(f"attempt {context.attempt} of {key} failed")
    return list(result.worker_ids)


@task
def exits(code: int) -> None:
    raise SystemExit(code)


@task
def interrupted() -> None:
    raise KeyboardInterrupt
