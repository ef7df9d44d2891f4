"""Test settings: the project's settings plus the test job types.

``CHOKAQ_TEST_OVERRIDES`` (JSON) lets acceptance tests give the worker
processes they start short intervals (e.g. a zombie timeout of a few seconds).
"""

import json
import os

from config.settings import *  # noqa: F403
from config.settings import CHOKAQ

CHOKAQ = {
    **CHOKAQ,
    "JOB_MODULES": [*CHOKAQ.get("JOB_MODULES", []), "tests.jobs"],  # type: ignore[misc]
}
for _section, _values in json.loads(os.environ.get("CHOKAQ_TEST_OVERRIDES", "{}")).items():
    if isinstance(_values, dict):
        CHOKAQ[_section] = {**CHOKAQ.get(_section, {}), **_values}  # type: ignore[dict-item]
    else:
        CHOKAQ[_section] = _values

# Test apps: ``tests.ops`` holds the django.tasks examples (a ``django.task:`` key resolves only inside installed
# apps), ``tests.adopter`` a ``jobs.py`` and a ``tasks.py`` that no module imports (autodiscovery tests).
INSTALLED_APPS = [*INSTALLED_APPS, "tests.ops", "tests.adopter"]  # noqa: F405

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Tests never run collectstatic: plain static names, served by WhiteNoise from the apps (hashed names and their
# cache lifetime are tested with a collected STATIC_ROOT of their own, tests/deck/test_static.py).
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
WHITENOISE_USE_FINDERS = True
