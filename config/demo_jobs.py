"""Demo job types for the README's run command (listed in ``CHOKAQ["JOB_MODULES"]``)."""

from __future__ import annotations

import random
import time
from datetime import timedelta
from typing import Any

from chokaq_core import ChokaQThrottledError, JobContext, enqueue_many, job


@job("demo.email.send.v1", queue="emails")
def send_email(ctx: JobContext, to: str, subject: str) -> None:
    time.sleep(random.uniform(0.01, 0.2))


@job("demo.report.build.v1", queue="reports")
def build_report(ctx: JobContext, report_id: int, pages: int = 5) -> None:
    for page in range(pages):
        ctx.raise_if_cancelled()
        ctx.progress(100 * (page + 1) / pages, f"page {page + 1}/{pages}")
        time.sleep(0.2)


@job("demo.payment.capture.v1", queue="default")
def capture_payment(ctx: JobContext, order_id: int, fail_attempts: int = 0) -> None:
    if ctx.attempt <= fail_attempts:
        raise ConnectionError(f"payment gateway timeout on attempt {ctx.attempt}")


@job("demo.image.resize.v1", queue="default")
def resize_image(ctx: JobContext, url: str, width: int) -> None:
    if width <= 0:
        raise ValueError(f"width must be positive, got {width}")


@job("demo.api.sync.v1", queue="default")
def sync_api(ctx: JobContext, account: str) -> None:
    if ctx.attempt < 3:
        raise ChokaQThrottledError("rate limited by partner API", retry_after=2)


def enqueue_demo(count: int = 300) -> list[str]:
    """A mix that succeeds, retries, fails into the DLQ and waits (delayed)."""
    rng = random.Random(7)
    items: list[Any] = []
    for n in range(count):
        roll = rng.random()
        if roll < 0.45:
            items.append(send_email.request(to=f"user{n}@example.com", subject="Welcome"))
        elif roll < 0.6:
            items.append(build_report.using(priority=20, tags=["reports"]).request(report_id=n, pages=3))
        elif roll < 0.75:
            items.append(capture_payment.request(order_id=n, fail_attempts=rng.choice([0, 1, 2, 5])))
        elif roll < 0.85:
            items.append(resize_image.request(url=f"https://img.example/{n}.png", width=rng.choice([640, 0])))
        elif roll < 0.9:
            items.append(sync_api.request(account=f"acct-{n}"))
        else:
            items.append(send_email.using(delay=timedelta(seconds=rng.randint(30, 300)), tags=["delayed"])
                         .request(to=f"later{n}@example.com", subject="Reminder"))
    return enqueue_many(items)
