"""The demo admin of ``scripts/run``: created once, and only where it cannot take over somebody's account.

``scripts/run`` calls ``claim_if_new()`` before migrating: a database without any table is one scripts/run is
about to create, and its identity is written into ``$CHOKAQ_VAR_DIR/demo-databases``. After migrating,
``ensure_demo_admin()``:

* creates the superuser when it does not exist — on a database scripts/run created, or one without any user
  — with ``CHOKAQ_ADMIN_PASSWORD`` or a fresh random password (kept in ``$CHOKAQ_VAR_DIR/demo-admin-password``,
  mode 600, to be shown again on later runs);
* leaves an existing user alone — password, flags, everything — unless the database is one scripts/run
  created and ``CHOKAQ_ADMIN_PASSWORD`` is given explicitly (then that password is set);
* on a database scripts/run did not create that already has users, creates no superuser at all.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection


def _var_dir() -> Path:
    return Path(getattr(settings, "VAR_DIR", "var"))


def database_identity() -> str:
    s = connection.settings_dict
    return f"{connection.vendor}:{s.get('HOST') or ''}:{s.get('PORT') or ''}/{s.get('NAME')}"


def _claimed(marker: Path) -> set[str]:
    try:
        return set(marker.read_text().split("\n")) - {""}
    except FileNotFoundError:
        return set()


def claim_if_new(marker: Path | None = None) -> bool:
    """Before ``migrate``: remember this database as scripts/run's own if it has no table yet."""
    marker = marker or _var_dir() / "demo-databases"
    if connection.introspection.table_names():
        return False
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("\n".join(sorted(_claimed(marker) | {database_identity()})) + "\n")
    return True


def ensure_demo_admin(username: str, password: str | None, marker: Path | None = None,
                      password_file: Path | None = None) -> str:
    """Create the demo superuser if allowed (see the module docstring); the line scripts/run prints."""
    marker = marker or _var_dir() / "demo-databases"
    password_file = password_file or _var_dir() / "demo-admin-password"
    users = get_user_model()._default_manager
    ours = database_identity() in _claimed(marker)
    user = users.filter(username=username).first()
    if user is None:
        if not ours and users.exists():
            return (f"Deck login: no demo admin created ({database_identity()} was not created by scripts/run and "
                    f"has users; use one of them or `python manage.py createsuperuser`)")
        chosen = password or secrets.token_urlsafe(12)
        users.create_superuser(username=username, email="", password=chosen)
        if password is None:
            password_file.parent.mkdir(parents=True, exist_ok=True)
            password_file.write_text(chosen + "\n")
            os.chmod(password_file, 0o600)
        return f"Deck login: {username} / {chosen}"
    if ours and password:
        user.set_password(password)
        user.save(update_fields=["password"])
        password_file.unlink(missing_ok=True)
        return f"Deck login: {username} / {password}"
    if ours and password_file.exists():
        return f"Deck login: {username} / {password_file.read_text().strip()} (generated when it was created)"
    return (f"Deck login: {username} (an existing user: its password was not changed; "
            f"`python manage.py changepassword {username}` sets one)")
