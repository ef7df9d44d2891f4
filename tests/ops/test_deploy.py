"""The production settings mode and docker-compose.yml (no container engine here: settings and commands)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import get_commands, load_command_class
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def resolve(value: str, overrides: dict[str, str]) -> str:
    """Compose's ${NAME:-default} / ${NAME:?message} substitution."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        if name in overrides:
            return overrides[name]
        if op == ":?":
            raise KeyError(f"{name} is required: {arg}")
        return arg

    return re.sub(r"\$\{(\w+)(:-|:\?)?([^}]*)\}", one, value)


def production_env(service: str = "web", **overrides: str) -> dict[str, str]:
    values = {"DJANGO_SECRET_KEY": secrets.token_urlsafe(60), **overrides}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CHOKAQ_", "DATABASE_URL", "REDIS"))}
    env.update({k: resolve(str(v), values) for k, v in SERVICES[service]["environment"].items()})
    # the compose hosts, as this machine reaches them
    env["DATABASE_URL"] = env["DATABASE_URL"].replace("@postgres:", "@127.0.0.1:")
    env["REDIS_URL"] = env["REDIS_URL"].replace("//redis:", "//127.0.0.1:")
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    env["CHOKAQ_VAR_DIR"] = str(ROOT / "var")
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_production_mode_passes_check_deploy() -> None:
    env = production_env()
    assert env["DJANGO_ENV"] == "production"
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_development_mode_does_not() -> None:
    env = {k: v for k, v in production_env().items() if k != "DJANGO_ENV"}
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    assert "security.W018" in result.stderr + result.stdout  # DEBUG on


@pytest.mark.parametrize(("missing", "message"), [("DJANGO_SECRET_KEY", "DJANGO_SECRET_KEY"),
                                                  ("REDIS_URL", "REDIS_URL"),
                                                  ("DJANGO_ALLOWED_HOSTS", "DJANGO_ALLOWED_HOSTS")])
def test_production_refuses_missing_settings(missing: str, message: str) -> None:
    env = {k: v for k, v in production_env().items() if k != missing}
    result = manage(env, "check")
    assert result.returncode != 0
    assert message in result.stderr


def test_compose_services_and_scaling() -> None:
    assert {"postgres", "redis", "migrate", "web", "worker"} <= set(SERVICES)
    web, worker = SERVICES["web"], SERVICES["worker"]
    assert web["command"][0] == "daphne" and web["command"][-1] == "config.asgi:application"
    # --scale worker=N needs no fixed name and no published host port
    assert "container_name" not in worker and "ports" not in worker
    assert worker["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    for name in ("web", "worker", "migrate"):
        env = SERVICES[name]["environment"]
        assert env["DJANGO_ENV"] == "production"
        assert env["REDIS_URL"].startswith("redis://redis:")
        assert env["DATABASE_URL"].startswith("postgres://")
    settings_text = (ROOT / "config/settings.py").read_text()
    for variable in SERVICES["web"]["environment"]:
        assert variable in settings_text, f"{variable} is set by compose but not read by config/settings.py"


def test_mssql_profile() -> None:
    mssql = {name: s for name, s in SERVICES.items() if "mssql" in (s.get("profiles") or [])}
    assert {"mssql", "migrate-mssql", "web-mssql", "worker-mssql"} <= set(mssql)
    for name in ("migrate-mssql", "web-mssql", "worker-mssql"):
        assert mssql[name]["environment"]["DATABASE_URL"].startswith("mssql://")
        assert mssql[name]["build"]["args"]["INSTALL_MSSQL_DRIVER"] == "1"
    from config.settings import database_from_url

    url = resolve(mssql["web-mssql"]["environment"]["DATABASE_URL"], {})
    db = database_from_url(url)
    assert (db["ENGINE"], db["HOST"], db["NAME"]) == ("mssql", "mssql", "chokaq")
    assert db["OPTIONS"] == {"driver": "ODBC Driver 18 for SQL Server", "extra_params": "TrustServerCertificate=yes"}


def test_every_compose_command_is_a_known_command_with_valid_options() -> None:
    commands = get_commands()
    for service in SERVICES.values():
        lines = [service.get("command") or []]
        check = (service.get("healthcheck") or {}).get("test") or []
        if check[:1] == ["CMD"] and "manage.py" in check:
            lines.append(check[1:])
        for line in lines:
            parts = line if isinstance(line, list) else line.split()
            if parts[:2] == ["sh", "-c"]:
                parts = parts[2].replace("&&", " ").split()
            for i, word in enumerate(parts):
                if word == "manage.py":
                    name, args = parts[i + 1], [a for a in parts[i + 2:] if a != "python"]
                    if "manage.py" in args:
                        args = args[: args.index("manage.py")]
                    assert name in commands, name
                    command = load_command_class(commands[name], name)
                    command.create_parser("manage.py", name).parse_args(args)


def test_probes_are_not_redirected_to_https(settings: Any, db: None) -> None:
    exempt = [r"^deck/health/$", r"^deck/metrics$"]
    assert 'SECURE_REDIRECT_EXEMPT = [r"^deck/health/$", r"^deck/metrics$"]' in (ROOT / "config/settings.py").read_text()
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_REDIRECT_EXEMPT = exempt
    client = Client()
    assert client.get("/deck/health/").status_code in (200, 503)
    assert client.get("/deck/metrics").status_code == 200
    assert client.get("/admin/").status_code == 301
