"""``scripts/run``'s demo admin: created once; an existing account on a database it did not create is never
changed (today's finding: every run reset the password of any user called ``admin`` and made it a superuser)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from config.demo_admin import claim_if_new, database_identity, ensure_demo_admin

pytestmark = [pytest.mark.django_db]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "demo-databases"


def claim(marker: Path) -> None:
    marker.write_text(database_identity() + "\n")


def test_a_database_with_tables_is_not_claimed(marker: Path) -> None:
    assert claim_if_new(marker) is False  # the test database is migrated
    assert not marker.exists()


def test_on_its_own_database_the_admin_is_created_once_with_a_random_password(marker: Path, tmp_path: Path) -> None:
    claim(marker)
    secret = tmp_path / "demo-admin-password"
    line = ensure_demo_admin("admin", None, marker, secret)
    password = secret.read_text().strip()
    assert line == f"Deck login: admin / {password}" and len(password) >= 12
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.check_password(password)
    again = ensure_demo_admin("admin", None, marker, secret)  # a second run: the same password, shown again
    assert password in again
    assert User.objects.get(username="admin").password == admin.password


def test_an_explicit_password_applies_on_its_own_database(marker: Path, tmp_path: Path) -> None:
    claim(marker)
    ensure_demo_admin("admin", None, marker, tmp_path / "pw")
    assert ensure_demo_admin("admin", "chosen-pw-123", marker, tmp_path / "pw") == "Deck login: admin / chosen-pw-123"
    assert User.objects.get(username="admin").check_password("chosen-pw-123")


def test_an_existing_user_on_a_foreign_database_is_never_changed(marker: Path, tmp_path: Path) -> None:
    someone = User.objects.create_user("admin", password="their-own-password-1")
    before = (someone.password, someone.is_superuser, someone.is_staff)
    line = ensure_demo_admin("admin", "demo-password-9", marker, tmp_path / "pw")
    after = User.objects.get(pk=someone.pk)
    assert (after.password, after.is_superuser, after.is_staff) == before
    assert after.check_password("their-own-password-1")
    assert "password was not changed" in line and "demo-password-9" not in line


def test_no_superuser_is_added_to_a_foreign_database_with_users(marker: Path, tmp_path: Path) -> None:
    User.objects.create_user("alice", password="alices-password-1")
    line = ensure_demo_admin("admin", None, marker, tmp_path / "pw")
    assert not User.objects.filter(username="admin").exists()
    assert "no demo admin created" in line


def test_scripts_run_uses_it_and_sets_no_password_itself() -> None:
    script = (ROOT / "scripts" / "run").read_text()
    assert "claim_if_new()" in script.split("manage.py migrate")[0], "the database is claimed before migrating"
    assert "ensure_demo_admin(" in script
    assert "set_password" not in script and "is_superuser" not in script
    assert 'export DJANGO_DEBUG="${DJANGO_DEBUG:-1}"' in script
