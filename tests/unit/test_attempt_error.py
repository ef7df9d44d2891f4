"""``AttemptError.of``: what the attempts history keeps of an exception."""

from __future__ import annotations

from chokaq_core.domain import MAX_ATTEMPT_MESSAGE, MAX_ATTEMPT_TRACEBACK, AttemptError


def _chained(n: int) -> None:
    """A traceback far over the limit: ``n`` chained causes, each with its own long message."""
    try:
        if n:
            _chained(n - 1)
        raise OSError("cause " * 100)
    except OSError as exc:
        raise ConnectionError(f"gateway timeout {n} " + "x" * 2000) from exc


def test_class_path_message_and_traceback_in_format_exceptions_shape() -> None:
    try:
        raise KeyError("missing")
    except KeyError as exc:
        error = AttemptError.of(exc)
    assert (error.error_class, error.message) == ("builtins.KeyError", "'missing'")
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert error.traceback.endswith("KeyError: 'missing'\n")


def test_a_long_traceback_keeps_its_first_line_and_the_exception_at_the_end() -> None:
    try:
        _chained(10)
    except ConnectionError as exc:
        error = AttemptError.of(exc)
    assert len(error.traceback) == MAX_ATTEMPT_TRACEBACK
    assert error.traceback.startswith("Traceback (most recent call last):\n  ...\n")
    assert error.traceback.endswith("ConnectionError: gateway timeout 10 " + "x" * 2000 + "\n")
    assert len(error.message) == MAX_ATTEMPT_MESSAGE
