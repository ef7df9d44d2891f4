"""ChokaQ's own instruments are exposed exactly as prometheus_client's Counter, Histogram and Gauge expose the
same recordings: only a process that serves metrics imports prometheus_client, and a scrape loses no sample."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as ClientCounter
from prometheus_client import Gauge as ClientGauge
from prometheus_client import Histogram as ClientHistogram
from prometheus_client import metrics as client_metrics

from chokaq_core import metrics
from chokaq_core.metrics import Counter, Gauge, Histogram, Instrument
from chokaq_core.prometheus import REGISTRY, InstrumentCollector

CREATED = re.compile(rb"^(\w+_created\{[^}]*\}) \S+$", re.MULTILINE)


def twins() -> tuple[list[Instrument], CollectorRegistry, list[Any]]:
    """The same four instruments as ChokaQ's and as prometheus_client's (in its own registry)."""
    ours: list[Instrument] = []
    theirs = CollectorRegistry(auto_describe=True)
    Counter("t_jobs", "Jobs.", ["queue", "type"], registry=ours)
    Histogram("t_lag", "Lag, ms.", ["queue"], buckets=metrics.MS_BUCKETS, registry=ours)
    Gauge("t_active", "Running.", ["queue"], registry=ours)
    Counter("t_idle", "Never recorded.", ["outcome"], registry=ours)
    client = [ClientCounter("t_jobs", "Jobs.", ["queue", "type"], registry=theirs),
              ClientHistogram("t_lag", "Lag, ms.", ["queue"], buckets=metrics.MS_BUCKETS, registry=theirs),
              ClientGauge("t_active", "Running.", ["queue"], registry=theirs),
              ClientCounter("t_idle", "Never recorded.", ["outcome"], registry=theirs)]
    return ours, theirs, client


def record(jobs: Any, lag: Any, active: Any) -> None:
    jobs.labels(queue="a", type="x").inc()
    jobs.labels(type="y", queue='b"<q>\\').inc(2.5)
    jobs.labels(queue="a", type="x").inc(3)
    for value in (0, 1, 1.5, 5, 7, 300_000, 900_001, math.inf, 0.25):
        lag.labels(queue="a").observe(value)
    lag.labels(queue="b").observe(12)
    active.labels(queue="a").inc()
    active.labels(queue="a").inc()
    active.labels(queue="a").dec()
    active.labels(queue="b").dec()


def exposed(registry: CollectorRegistry) -> bytes:
    return CREATED.sub(rb"\1 T", generate_latest(registry))  # creation times differ by the microseconds between


@pytest.mark.parametrize("created_series", [True, False])
def test_the_instruments_are_exposed_sample_for_sample_as_prometheus_clients_own(
        created_series: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_metrics, "_use_created", created_series)  # PROMETHEUS_DISABLE_CREATED_SERIES
    ours, theirs, client = twins()
    mine = CollectorRegistry(auto_describe=True)
    mine.register(InstrumentCollector(ours))
    record(*ours[:3])
    record(*client[:3])
    text = exposed(mine)
    assert text == exposed(theirs)
    assert (b"_created" in text) is created_series
    assert b't_lag_bucket{le="+Inf",queue="a"} 9.0' in text and b't_jobs_total{queue="a",type="x"} 4.0' in text


def test_the_instruments_refuse_what_prometheus_client_refuses() -> None:
    ours, _, _ = twins()
    with pytest.raises(ValueError):
        ours[0].labels(queue="a")
    with pytest.raises(ValueError):
        ours[0].labels(queue="a", type="x", extra="1")
    with pytest.raises(ValueError):
        ours[0].labels(queue="a", type="x").inc(-1)


def test_the_served_registry_holds_every_process_instrument_before_the_fleet_gauges() -> None:
    names = [family.name for family in REGISTRY.collect()]  # no database here: the fleet gauges report an error
    assert names[:len(metrics.INSTRUMENTS)] == [instrument.name for instrument in metrics.INSTRUMENTS]
    assert "chokaq_scrape_error" in names
