"""Autodiscovery: every installed app's ``jobs.py`` and ``tasks.py`` load once the models are ready, in any process.

Each check runs in a fresh interpreter (a subprocess) so no import made by the test run itself can hide a
module that autodiscovery failed to load. ``tests.adopter`` is an installed app whose ``jobs.py`` and
``tasks.py`` nothing imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chokaq_core import enqueue
from chokaq_core.models import JobsArchive, JobsDLQ
from tests.conftest import database_url

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import sys; from chokaq_core.handlers import get_definition; "
    "print('PROBE ' + __import__('json').dumps({'job': get_definition('adopter.ping.v1') is not None, "
    "'modules': sorted(m for m in ('tests.adopter.jobs', 'tests.adopter.tasks') if m in sys.modules)}))"
)
DISCOVERED = {"job": True, "modules": ["tests.adopter.jobs", "tests.adopter.tasks"]}


def _env() -> dict[str, str]:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": database_url(),
            "PYTHONUNBUFFERED": "1"}


def _probe(argv: list[str]) -> dict[str, object]:
    done = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    return json.loads(line.removeprefix("PROBE "))


def test_django_setup_imports_every_apps_jobs_and_tasks_modules() -> None:
    """What every process does first (``manage.py``, ``get_asgi_application()``, the worker's command)."""
    assert _probe([sys.executable, "-c", f"import django; django.setup(); {PROBE}"]) == DISCOVERED


def test_a_management_command_sees_the_apps_jobs() -> None:
    assert _probe([sys.executable, "manage.py", "shell", "-c", PROBE]) == DISCOVERED


def test_a_web_process_sees_the_apps_jobs() -> None:
    code = f"from django.core.asgi import get_asgi_application; get_asgi_application(); {PROBE}"
    assert _probe([sys.executable, "-c", code]) == DISCOVERED


@pytest.mark.django_db(transaction=True)
def test_a_worker_process_runs_a_job_whose_module_nothing_imports() -> None:
    job_id = enqueue("adopter.ping.v1", {"word": "hello"})
    done = subprocess.run([sys.executable, "manage.py", "chokaq_worker", "--burst"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert list(JobsDLQ.objects.filter(id=job_id).values_list("error_details", flat=True)) == []
    archived = JobsArchive.objects.get(id=job_id)
    assert archived.result == '"hello"'
