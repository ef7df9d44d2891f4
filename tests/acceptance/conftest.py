"""Fixtures shared by the acceptance tests (real worker processes on the test database)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection


@pytest.fixture
def executions_table(transactional_db: None) -> Iterator[None]:
    """The table ``test.record.v1`` writes into, in the test database (dropped afterwards)."""
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS test_executions")
        cursor.execute(
            "CREATE TABLE test_executions (id bigserial PRIMARY KEY, job_id varchar(50) NOT NULL, attempt int)"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS test_executions")
