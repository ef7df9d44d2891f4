"""The Deck's static files with content-hashed names and a long cache lifetime (the demo project's setup)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from config import settings as project_settings

pytestmark = pytest.mark.django_db


@pytest.fixture
def collected(settings: Any, tmp_path: Path) -> Path:
    """The project's static setup (config.settings) on a STATIC_ROOT collected for this test."""
    settings.STORAGES = project_settings.STORAGES
    settings.STATIC_ROOT = tmp_path / "static"
    settings.WHITENOISE_USE_FINDERS = False
    settings.DEBUG = False
    call_command("collectstatic", interactive=False, verbosity=0)
    return Path(settings.STATIC_ROOT)


def test_the_project_uses_hashed_names_served_by_whitenoise() -> None:
    assert project_settings.STORAGES["staticfiles"]["BACKEND"] == \
        "whitenoise.storage.CompressedManifestStaticFilesStorage"
    assert "whitenoise.middleware.WhiteNoiseMiddleware" in project_settings.MIDDLEWARE


def test_the_page_links_hashed_static_files_served_with_an_immutable_lifetime(
        collected: Path, client_as: Callable[[str], Client]) -> None:
    html = client_as("viewer").get("/deck/").content.decode()
    links = re.findall(r'(?:src|href)="(/static/deck/[^"]+)"', html)
    assert links and all(re.search(r"\.[0-9a-f]{12}\.(?:js|css)$", link) for link in links), links
    assert "/static/deck/deck.css" not in html
    css = next(link for link in links if "/deck/deck." in link and link.endswith(".css"))
    answer = Client().get(css, HTTP_ACCEPT_ENCODING="gzip")
    assert answer.status_code == 200
    assert answer["Cache-Control"] == "max-age=315360000, public, immutable"
    assert answer.get("Content-Encoding") == "gzip"  # served pre-compressed
