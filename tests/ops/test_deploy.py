"""The production settings mode, docker-compose.yml and the Dockerfile (no container engine here: settings,
commands, and the containers' shell commands run against stand-ins for daphne and redis-server)."""

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


SECRETS = ("DJANGO_SECRET_KEY", "POSTGRES_PASSWORD", "REDIS_PASSWORD")


def production_env(service: str = "web", **overrides: str) -> dict[str, str]:
    values = {**{name: secrets.token_urlsafe(60) for name in SECRETS}, **overrides}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CHOKAQ_", "DATABASE_URL", "REDIS"))}
    env.update({k: resolve(str(v), values) for k, v in SERVICES[service]["environment"].items()})
    # the compose hosts, as this machine reaches them
    env["DATABASE_URL"] = env["DATABASE_URL"].replace("@postgres:", "@127.0.0.1:")
    env["REDIS_URL"] = re.sub(r"//:[^@]+@redis:", "//127.0.0.1:", env["REDIS_URL"])  # this machine's has no password
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
    env["DJANGO_DEBUG"] = "1"
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
    assert web["command"][:2] == ["sh", "-c"] and web["command"][2].endswith("config.asgi:application")
    # --scale worker=N needs no fixed name and no published host port
    assert "container_name" not in worker and "ports" not in worker
    assert worker["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    for name in ("web", "worker", "migrate"):
        env = SERVICES[name]["environment"]
        assert env["DJANGO_ENV"] == "production"
        assert env["REDIS_URL"].startswith("redis://:${REDIS_PASSWORD:?")
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


# ---------------------------------------------------------------- safe defaults


def project_settings(env: dict[str, str], *names: str) -> list[str]:
    """``config.settings`` values as a fresh process with ``env`` sees them."""
    code = f"import config.settings as s; print(*[repr(getattr(s, n, None)) for n in {names!r}], sep='\\n')"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def development_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CHOKAQ_", "REDIS"))}
    return {**env, "CHOKAQ_VAR_DIR": str(ROOT / "var"), **extra}


def test_debug_is_off_unless_asked_for_explicitly() -> None:
    assert project_settings(development_env(), "DEBUG", "ALLOWED_HOSTS") == [
        "False", "['localhost', '127.0.0.1', '[::1]']"]  # no testserver outside tests
    assert project_settings(development_env(DJANGO_DEBUG="1"), "DEBUG") == ["True"]
    assert project_settings(development_env(DJANGO_DEBUG="true"), "DEBUG") == ["False"]  # "1" only
    production = {**production_env(), "DJANGO_DEBUG": "1"}
    assert project_settings(production, "DEBUG") == ["False"]


def test_no_demo_jobs_in_production() -> None:
    assert project_settings(production_env(), "CHOKAQ") == ["{'JOB_MODULES': [], 'REQUIRE_REGISTERED_JOB_TYPES': True}"]
    assert "config.demo_jobs" in project_settings(development_env(), "CHOKAQ")[0]
    for name in ("web", "worker", "migrate"):
        assert resolve(SERVICES[name]["environment"]["CHOKAQ_JOB_MODULES"], {}) == ""


def test_compose_refuses_to_start_without_its_secrets() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    fallbacks = re.findall(r"\$\{(\w*(?:PASSWORD|SECRET)\w*):-([^}]+)\}", text)
    assert fallbacks == [], f"fallback secrets: {fallbacks}"
    strings = re.findall(r"\$\{\w+(?::[-?][^}]*)?\}", text)
    for secret in SECRETS:
        others = {name: "x" for name in SECRETS if name != secret}
        with pytest.raises(KeyError, match=secret):
            for value in strings:
                resolve(value, others)


def run_container_command(command: list[str], env: dict[str, str], stand_in: str, tmp_path: Path) -> str:
    """Run a service's ``sh -c`` command (after compose's ``$$`` → ``$``) with ``stand_in`` on PATH printing
    its arguments and standard input instead of the real program."""
    assert command[:2] == ["sh", "-c"]
    program = tmp_path / stand_in
    program.write_text('#!/bin/sh\necho "args: $*"\n[ -t 0 ] || cat\n')
    program.chmod(0o755)
    result = subprocess.run(["sh", "-c", command[2].replace("$$", "$")], env={"PATH": f"{tmp_path}:/usr/bin:/bin",
                            **env}, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("service", ["web", "web-mssql"])
def test_proxy_headers_only_behind_a_declared_proxy(service: str, tmp_path: Path) -> None:
    command = SERVICES[service]["command"]
    assert resolve(SERVICES["web"]["environment"]["DJANGO_BEHIND_PROXY"], {}) == "0"
    direct = run_container_command(command, {"DJANGO_BEHIND_PROXY": "0"}, "daphne", tmp_path)
    assert direct.strip() == "args: -b 0.0.0.0 -p 8000 config.asgi:application"
    proxied = run_container_command(command, {"DJANGO_BEHIND_PROXY": "1"}, "daphne", tmp_path)
    assert proxied.strip() == "args: -b 0.0.0.0 -p 8000 --proxy-headers config.asgi:application"
    assert "--proxy-headers" not in (ROOT / "Dockerfile").read_text().split("CMD", 1)[1]
    # Django trusts X-Forwarded-Proto under the same declaration only
    assert project_settings(production_env(), "SECURE_PROXY_SSL_HEADER") == ["None"]
    assert project_settings(production_env(DJANGO_BEHIND_PROXY="1"), "SECURE_PROXY_SSL_HEADER") == [
        "('HTTP_X_FORWARDED_PROTO', 'https')"]
    assert SERVICES[service]["ports"][0].startswith("${CHOKAQ_WEB_BIND:-127.0.0.1}:")


def test_redis_runs_with_a_password(tmp_path: Path) -> None:
    redis = SERVICES["redis"]
    config = run_container_command(redis["command"], {"REDIS_PASSWORD": "s3cret-Pw"}, "redis-server", tmp_path)
    assert config.splitlines() == ["args: -", "requirepass s3cret-Pw"]  # on stdin: not in the process list
    assert "REDISCLI_AUTH" in redis["healthcheck"]["test"][1]
    url = resolve(SERVICES["worker"]["environment"]["REDIS_URL"], {"REDIS_PASSWORD": "s3cret-Pw"})
    assert url == "redis://:s3cret-Pw@redis:6379/0"


DEV_TOOLS = ("pytest", "hypothesis", "playwright", "ruff", "mypy", "django-stubs", "pyyaml", "websockets", "build")


def test_the_image_has_no_test_or_dev_tools() -> None:
    import tomllib

    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = re.findall(r"pip install --no-cache-dir ([^\n]*)", dockerfile)
    assert installs == ["'.[postgres,redis,mssql,otel,server]' 'dj-database-url>=2.1' 'whitenoise>=6.8' \\"], installs
    assert "-r requirements-dev.txt" not in dockerfile
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    shipped = [*project["dependencies"], *(d for name in ("postgres", "redis", "mssql", "otel", "server")
                                           for d in extras[name])]
    names = [re.split(r"[<>=\[ ]", d, maxsplit=1)[0].lower() for d in shipped]
    assert not [name for name in names if name in DEV_TOOLS], names
    dev = (ROOT / "requirements-dev.txt").read_text().lower()
    assert all(tool in dev for tool in DEV_TOOLS)  # the tools live there, for scripts/test
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"tests", "bench", "docs", "scripts/test", "requirements-dev.txt"} <= set(ignored)
    assert "apt-get purge -y --auto-remove curl gnupg" in dockerfile  # only needed to fetch the ODBC driver
    first_install = dockerfile.split("apt-get install", 2)[1].split("&&")[0]
    assert "curl" not in first_install and "gnupg" not in first_install


def test_the_image_compiles_the_packages_its_processes_import_from_app() -> None:
    """``python manage.py …`` in /app imports /app's chokaq_core, deck, config and shop (the script's folder is
    first on sys.path), and the image sets PYTHONDONTWRITEBYTECODE: without compiling them at build time, every
    worker compiles the engine from source at each start."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "PYTHONDONTWRITEBYTECODE=1" in dockerfile and "WORKDIR /app" in dockerfile
    compiled = re.findall(r"^RUN python -m compileall -q ([^\n]*)$", dockerfile, re.MULTILINE)
    assert compiled and set(compiled[0].split()) >= {"chokaq_core", "deck", "config", "shop"}, compiled
    assert dockerfile.index("COPY . .") < dockerfile.index("RUN python -m compileall")
    assert "**/__pycache__" in (ROOT / ".dockerignore").read_text()  # the build's own, not a developer's stale ones
