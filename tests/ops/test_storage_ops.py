"""Schedule tick claims racing on two connections (the single-connection contract is in tests/storage)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections

from chokaq_core import storage
from chokaq_core.api import EnqueueOptions, build
from chokaq_core.models import JobsHot

pytestmark = pytest.mark.django_db(transaction=True)


def _job(name: str) -> Any:
    return build(EnqueueOptions("test.ok.v1", {"schedule": name}))


def test_concurrent_claims_enqueue_one_job() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    storage.enqueue_scheduled("every", t0, _job("every"))
    tick = t0 + timedelta(minutes=1)
    barrier = threading.Barrier(4)
    results: list[str | None] = []

    def claim() -> None:
        try:
            barrier.wait()
            results.append(storage.enqueue_scheduled("every", tick, _job("every")))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4
    assert len([r for r in results if r]) == 1
    assert JobsHot.objects.count() == 1
