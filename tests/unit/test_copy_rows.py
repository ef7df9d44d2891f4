"""PostgreSQL's bulk enqueue builds its COPY rows itself (one buffer a batch): every value comes back exactly."""

from __future__ import annotations

import pytest

from chokaq_core.domain import NewJob
from chokaq_core.sql.postgresql import copy_rows

NOW = "2026-12-07 17:00:00.123456+00"
_UNESCAPED = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def parsed(buffer: bytes) -> list[list[str | None]]:
    """COPY's text format read back as PostgreSQL reads it: tab-separated fields, one row a line, a field that is
    exactly \\N is NULL, a backslash escapes the next character."""
    rows = []
    for line in buffer.decode().split("\n")[:-1]:
        fields: list[str | None] = []
        for raw in line.split("\t"):
            if raw == "\\N":
                fields.append(None)
                continue
            out, chars = [], iter(raw)
            for char in chars:
                out.append(_UNESCAPED.get(nxt := next(chars), nxt) if char == "\\" else char)
            fields.append("".join(out))
        rows.append(fields)
    return rows


def row(job: NewJob) -> list[str | None]:
    return [job.id, job.queue, job.type, job.payload, job.tags, str(job.priority), job.created_by, job.rate_key,
            NOW, NOW]


def test_a_batch_without_characters_to_escape_is_its_values_tab_separated() -> None:
    jobs = [NewJob("01A", "default", "t.v1", "{}"), NewJob("01B", "q", "t.v1", '{"a":[1,"é 😀"]}', "x,y", None, -3,
                                                             None, "view", "tenant:1")]

    assert copy_rows(jobs, NOW) == (f"01A\tdefault\tt.v1\t{{}}\t\\N\t10\t\\N\t\\N\t{NOW}\t{NOW}\n"
                                    f'01B\tq\tt.v1\t{{"a":[1,"é 😀"]}}\tx,y\t-3\tview\ttenant:1\t{NOW}\t{NOW}\n'
                                    ).encode()


PLAIN = ["null", "", "\b\f\v", "żółć ✓ 😀", "\x01", "N", 'q"uo\'te']
ESCAPED = ["tab\there", "line\nbreak", "cr\rhere", "back\\slash", "\\N", "ends \\N", "\\"]
FIELDS = ["payload", "tags", "created_by", "rate_key", "queue", "id", "type"]


@pytest.mark.parametrize("odd", PLAIN)
@pytest.mark.parametrize("field", FIELDS)
def test_values_without_a_character_to_escape_come_back_exactly(odd: str, field: str) -> None:
    """The text "null", the empty text and other control characters are data: None alone is NULL."""
    jobs = [NewJob(f"01J{i:03d}", "default", "t.v1", "{}") for i in range(5)]
    setattr(jobs[2], field, odd)
    if field not in ("queue", "id", "type"):
        setattr(jobs[3], field, None)

    buffer = copy_rows(jobs, NOW)

    assert buffer is not None and parsed(buffer) == [row(job) for job in jobs]


@pytest.mark.parametrize("odd", ESCAPED)
@pytest.mark.parametrize("field", FIELDS)
def test_a_batch_with_a_value_to_escape_anywhere_is_left_to_the_driver(odd: str, field: str) -> None:
    """A backslash, tab, newline or CR in any value of any row: no buffer (the rows go through the driver's own
    escaping, which tests/storage/test_enqueue.py checks against the stored rows)."""
    jobs = [NewJob(f"01J{i:03d}", "default", "t.v1", "{}") for i in range(5)]
    setattr(jobs[4], field, odd)

    assert copy_rows(jobs, NOW) is None
