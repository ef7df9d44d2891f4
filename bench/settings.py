"""Benchmark settings: the project's settings plus the bench job types and optional overrides.

``CHOKAQ_JOB_MODULES=bench.jobs`` (set by bench.py) replaces the demo jobs;
``BENCH_CHOKAQ`` (JSON, from ``bench.py --chokaq``) overrides CHOKAQ sections.
"""

import json
import os

from config.settings import *  # noqa: F403
from config.settings import CHOKAQ

CHOKAQ = dict(CHOKAQ)
for _section, _values in json.loads(os.environ.get("BENCH_CHOKAQ", "{}")).items():
    if isinstance(_values, dict):
        CHOKAQ[_section] = {**CHOKAQ.get(_section, {}), **_values}  # type: ignore[dict-item]
    else:
        CHOKAQ[_section] = _values
