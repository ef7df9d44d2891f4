"""Django's documented ``@task`` examples (docs/topics/tasks.txt), plus a few for failure paths.

They run on the project's ``TASKS`` backend: ``chokaq_core.backend.ChokaQBackend``.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.mail import send_mail
from django.tasks import TaskContext, task

GATES: dict[str, threading.Event] = {}
SEEN_CONTEXTS: list[tuple[int, str]] = []


@task
def email_users(emails: list[str], subject: str, message: str) -> int:
    return send_mail(subject=subject, message=message, from_email=None, recipient_list=emails)


@task(priority=2, queue_name="emails")
def email_users_priority(emails: list[str], subject: str, message: str) -> int:
    return send_mail(subject=subject, message=message, from_email=None, recipient_list=emails)


@task(takes_context=True)
def email_users_with_context(context: TaskContext, emails: list[str], subject: str, message: str) -> int:
    print(f"Attempt {context.attempt} to send user email. Task result id: {context.task_result.id}.")
    SEEN_CONTEXTS.append((context.attempt, context.task_result.id))
    return send_mail(subject=subject, message=message, from_email=None, recipient_list=emails)


@task
def calculate_meaning_of_life() -> int:
    return 42


@task
async def acalculate_meaning_of_life() -> dict[str, Any]:
    return {"answer": 42, "question": None}


@task
def reject(value: int) -> None:
    raise ValueError(f"bad value {value}")


@task
def flaky(key: str) -> str:
    """Fails with a transient error on its first attempt only."""
    if key not in GATES:
        GATES[key] = threading.Event()
        raise ConnectionError("downstream unavailable")
    return "second time lucky"


@task
def wait_for_gate(name: str) -> str:
    GATES.setdefault(name, threading.Event()).wait(60)
    return name
