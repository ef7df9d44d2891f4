"""The duration histogram of the history roll-ups: fixed log-scale bins, percentiles read from the bins."""

from __future__ import annotations

import pytest

from chokaq_core.domain import DURATION_BIN_EDGES_MS, DURATION_BINS, duration_bin, percentile


def bins(**counts: int) -> list[int]:
    out = [0] * DURATION_BINS
    for key, n in counts.items():
        out[int(key.removeprefix("b"))] = n
    return out


def test_each_duration_falls_in_one_bin_of_the_1_2_5_scale() -> None:
    assert DURATION_BINS == 20 and DURATION_BIN_EDGES_MS[:4] == (1, 2, 5, 10)
    assert [duration_bin(d) for d in (0, 0.99, 1, 1.5, 2, 4.99, 5, 999, 1000, 999_999, 1_000_000, 1e12)] == [
        0, 0, 1, 1, 2, 2, 3, 9, 10, 18, 19, 19]


def test_percentiles_interpolate_inside_their_bin() -> None:
    h = bins(b02=10)  # ten durations in [2, 5) ms
    assert percentile(h, 0.5) == pytest.approx(3.5)
    assert percentile(h, 1.0) == pytest.approx(5.0)
    assert percentile(h, 1.0, max_ms=4.2) == pytest.approx(4.2), "never above the longest duration seen"
    two = bins(b01=90, b10=10)  # 90 in [1, 2) ms, 10 in [1, 2) s
    assert 1 <= percentile(two, 0.5) <= 2  # type: ignore[operator]
    assert 1000 <= percentile(two, 0.95) <= 2000  # type: ignore[operator]


def test_the_open_last_bin_ends_at_the_longest_duration() -> None:
    h = bins(b19=4)
    assert percentile(h, 0.5, max_ms=3_000_000) == pytest.approx(2_000_000)
    assert percentile(h, 0.5) == pytest.approx(1_000_000), "without a max the bin's lower edge"


def test_an_empty_histogram_has_no_percentile() -> None:
    assert percentile([0] * DURATION_BINS, 0.95) is None
    assert percentile([], 0.5) is None
