"""A Django team adopts ChokaQ: the built wheel, a fresh virtualenv, ``django-admin startproject`` and exactly the
README's steps ("Add ChokaQ to your project"), then the whole story on this run's database vendor (SQLite in the
SQLite run, PostgreSQL in the PostgreSQL run).

The project has an ``orders`` app with a model, a ``jobs.py`` that no view imports (the view enqueues by type
key) and a view that enqueues inside ``transaction.atomic()``. Checked: ``check`` prints nothing, ``migrate``,
a rolled-back POST leaves no job, a committed one is archived by ``chokaq_worker --burst`` and ``get_job()``
shows it, the Deck answers 200 for a superuser, and a websocket client connected through ``deck.asgi.with_deck``
under daphne receives a frame after an enqueue.

The wheel is built once per session; the virtualenv is kept under ``var/adoption/`` keyed by the package's
sources, so the PostgreSQL run reuses the one the SQLite run made.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from tests.acceptance.procs import free_port

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_SOURCES = ("pyproject.toml", "README.md", "chokaq_core", "deck")
EXTRAS = "postgres,server"
PROJECT = "shop"
JOB_TYPE = "orders.confirm.v1"
COMMAND_TIMEOUT = 300

# ---------------------------------------------------------------- the app a team writes

ORDERS_MODELS = '''
from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    job_id = models.CharField(max_length=26, blank=True)
    confirmed_at = models.DateTimeField(null=True)
'''

# Nothing imports this module but ChokaQ's autodiscovery.
ORDERS_JOBS = '''
from django.utils import timezone

from chokaq_core import job


@job("orders.confirm.v1", queue="orders")
def confirm_order(ctx, order_id):
    from orders.models import Order

    Order.objects.filter(pk=order_id).update(confirmed_at=timezone.now())
    return {"confirmed": order_id}
'''

ORDERS_VIEWS = '''
from django.db import transaction
from django.http import JsonResponse
from django.views.decorators.http import require_POST

import chokaq_core
from orders.models import Order


class RolledBack(Exception):
    pass


@require_POST
def place_order(request):
    try:
        with transaction.atomic():
            order = Order.objects.create(item=request.POST["item"])
            order.job_id = chokaq_core.enqueue("orders.confirm.v1", {"order_id": order.pk}, queue="orders")
            order.save(update_fields=["job_id"])
            if request.POST.get("rollback"):
                raise RolledBack(order.job_id)
    except RolledBack as exc:
        return JsonResponse({"rolled_back": str(exc)}, status=409)
    return JsonResponse({"order": order.pk, "job": order.job_id}, status=201)
'''

# Run with the venv's python in the project directory: one step per call, JSON on the last line of stdout.
DRIVER = '''
import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
import django

django.setup()

import chokaq_core
from chokaq_core.models import JobsArchive, JobsDLQ, JobsHot
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from orders.models import Order


def jobs():
    return JobsHot.objects.count() + JobsArchive.objects.count() + JobsDLQ.objects.count()


def post(**form):
    response = Client(HTTP_HOST="localhost").post("/orders/", form)
    return response.status_code, json.loads(response.content)


step = sys.argv[1]
out = {"chokaq_core": chokaq_core.__file__}
if step == "orders":
    out["rollback_status"], body = post(item="tea", rollback="1")
    out["rolled_back_job"] = body.get("rolled_back")
    out["jobs_after_rollback"] = jobs()
    out["orders_after_rollback"] = Order.objects.count()
    out["commit_status"], body = post(item="coffee")
    out["job"] = body.get("job")
    out["jobs_after_commit"] = jobs()
elif step == "after_worker":
    job_id = sys.argv[2]
    record = chokaq_core.get_job(job_id)
    out["status"] = None if record is None else getattr(record.status, "name", str(record.status))
    out["queue"] = None if record is None else record.queue
    out["unknown"] = chokaq_core.get_job("01ARZ3NDEKTSV4RRFFQ69G5FAV") is None
    out["confirmed"] = Order.objects.filter(job_id=job_id, confirmed_at__isnull=False).exists()
    out["archived"] = JobsArchive.objects.filter(id=job_id).exists()
elif step == "superuser":
    user = get_user_model().objects.create_superuser("boss", "boss@example.com", "pw-boss-1234")
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    out["deck_status"] = client.get("/deck/").status_code
    out["anonymous_location"] = Client(HTTP_HOST="localhost").get("/deck/").get("Location")
    out["session"] = client.cookies[settings.SESSION_COOKIE_NAME].value
elif step == "enqueue":
    out["job"] = chokaq_core.enqueue("orders.confirm.v1", {"order_id": 0}, queue="orders")
print(json.dumps(out))
'''


# ---------------------------------------------------------------- the wheel and the virtualenv


def sources_digest() -> str:
    """A digest of everything that goes into the wheel (the venv is rebuilt when it changes)."""
    digest = hashlib.sha256()
    for name in PACKAGE_SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()
                                                     and "__pycache__" not in p.parts)
        for file in files:
            digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build --wheel --no-isolation`` over a copy of the package's sources (offline)."""
    source = tmp_path_factory.mktemp("source")
    for name in PACKAGE_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(source)], cwd=source)
    (built,) = dist.glob("django_chokaq-*.whl")
    return built


@pytest.fixture(scope="session")
def venv(wheel: Path) -> Path:
    """A virtualenv that cannot see the checkout, with the wheel and its ``postgres`` and ``server`` extras."""
    home = Path(settings.VAR_DIR) / "adoption"
    target = home / f"venv-{sources_digest()}"
    python = target / "bin" / "python"
    if not (target / ".installed").exists():
        for old in home.glob("venv-*"):
            shutil.rmtree(old, ignore_errors=True)
        run([sys.executable, "-m", "venv", "--clear", str(target)], cwd=home if home.exists() else None)
        run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[{EXTRAS}]"],
            cwd=target)
        (target / ".installed").write_text(wheel.name)
    return target


def clean_env() -> dict[str, str]:
    """The environment of a project of its own: nothing of this checkout's settings or paths."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "CHOKAQ_", "PYTHON", "VIRTUAL_ENV", "DATABASE_URL", "REDIS_URL"))}


def run(argv: list[str], cwd: Path | None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, cwd=cwd, env=env if env is not None else clean_env(), capture_output=True,
                            text=True, timeout=COMMAND_TIMEOUT)
    assert result.returncode == 0, f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


# ---------------------------------------------------------------- the README's steps


def readme_steps() -> dict[str, str]:
    """The code blocks of the README's "Add ChokaQ to your project", by their first line (``# settings.py`` …)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Add ChokaQ to your project", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    steps = {block.splitlines()[0]: block for block in blocks}
    assert len(steps) == 4, steps.keys()
    return steps


@pytest.fixture
def database(vendor: str) -> Iterator[dict[str, Any]]:
    """The adoption project's own database on this run's vendor: a file, or a fresh PostgreSQL database."""
    if vendor == "sqlite":
        yield {}
        return
    assert vendor == "postgresql", vendor
    params = connection.settings_dict
    name = f"{params['NAME']}_adoption"[:63]
    conninfo = {"host": params["HOST"] or "127.0.0.1", "port": params["PORT"] or 5432, "user": params["USER"],
                "password": params["PASSWORD"] or None, "dbname": "postgres"}

    def admin(sql: str) -> None:
        with psycopg.connect(**conninfo, autocommit=True) as conn:
            conn.execute(sql)

    admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin(f'CREATE DATABASE "{name}"')
    yield {"ENGINE": "django.db.backends.postgresql", "NAME": name, "HOST": conninfo["host"],
           "PORT": str(conninfo["port"]), "USER": conninfo["user"], "PASSWORD": params["PASSWORD"] or ""}
    admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_project(venv: Path, where: Path, database: dict[str, Any]) -> Path:
    """``startproject shop`` + ``startapp orders`` with a model, jobs.py and a view, and the README's steps."""
    bin_dir = venv / "bin"
    run([str(bin_dir / "django-admin"), "startproject", PROJECT, str(where)], cwd=where.parent)
    run([str(bin_dir / "python"), "manage.py", "startapp", "orders"], cwd=where)
    (where / "orders" / "models.py").write_text(ORDERS_MODELS)
    (where / "orders" / "jobs.py").write_text(ORDERS_JOBS)
    (where / "orders" / "views.py").write_text(ORDERS_VIEWS)
    (where / "drive.py").write_text(DRIVER)
    package = where / PROJECT
    with (package / "settings.py").open("a") as out:
        out.write('\nINSTALLED_APPS += ["orders"]\n')
        if database:  # the project's PostgreSQL database, as its team configured it
            out.write(f"\nDATABASES = {{'default': {database!r}}}\n")
    with (package / "urls.py").open("a") as out:
        out.write('\nfrom orders.views import place_order\n\nurlpatterns += [path("orders/", place_order)]\n')
    return where


def apply_readme_steps(project: Path) -> None:
    """The three steps: settings, the one include, the ASGI helper."""
    steps = readme_steps()
    package = project / PROJECT
    with (package / "settings.py").open("a") as out:
        out.write("\n" + _block(steps, "# settings.py", exact=True))
    with (package / "urls.py").open("a") as out:
        out.write("\n" + _block(steps, "# urls.py"))
    asgi = (package / "asgi.py").read_text()
    assert "application = get_asgi_application()" in asgi
    (package / "asgi.py").write_text(asgi.replace("application = get_asgi_application()",
                                                  _block(steps, "# asgi.py")))


def _block(steps: dict[str, str], first_line: str, *, exact: bool = False) -> str:
    matches = [block for first, block in steps.items() if (first == first_line if exact else
                                                           first.startswith(first_line))]
    assert len(matches) == 1, (first_line, list(steps))
    return matches[0].replace("mysite", PROJECT)


# ---------------------------------------------------------------- the test


def manage(venv: Path, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run([str(venv / "bin" / "python"), "manage.py", *args], cwd=project)


def drive(venv: Path, project: Path, *args: str) -> dict[str, Any]:
    result = run([str(venv / "bin" / "python"), "drive.py", *args], cwd=project)
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def test_the_wheel_holds_exactly_the_two_apps(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"chokaq_core", "deck", wheel.name.split("-")[0] + "-"
                                                      + wheel.name.split("-")[1] + ".dist-info"}
    for expected in ("chokaq_core/py.typed", "deck/py.typed", "chokaq_core/migrations/0001_initial.py",
                     "deck/migrations/0001_initial.py", "deck/templates/deck/base.html",
                     "deck/static/deck/vendor/htmx.min.js", "deck/static/deck/vendor/uPlot.iife.min.js",
                     "chokaq_core/management/commands/chokaq_worker.py"):
        assert expected in names, expected
    metadata = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info/"
                                           "METADATA").decode()
    for extra in ("postgres", "redis", "mssql", "otel", "server"):
        assert f"Provides-Extra: {extra}" in metadata
    assert "Requires-Dist: Django>=6.1" in metadata


def test_a_fresh_project_adopts_chokaq_with_the_readmes_steps(venv: Path, tmp_path: Path, vendor: str,
                                                              database: dict[str, Any]) -> None:
    project = start_project(venv, tmp_path / PROJECT, database)
    sqlite = vendor == "sqlite"
    apply_readme_steps(project)
    if sqlite:  # before the README's SQLite line the check explains what is missing
        result = subprocess.run([str(venv / "bin" / "python"), "manage.py", "check"], cwd=project, env=clean_env(),
                                capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
        assert result.returncode == 1 and "chokaq.E009" in result.stderr and "IMMEDIATE" in result.stderr
        with (project / PROJECT / "settings.py").open("a") as out:
            out.write("\n" + _block(readme_steps(), "# settings.py, on SQLite"))

    check = manage(venv, project, "check")
    assert check.stdout.strip() == "System check identified no issues (0 silenced)." and check.stderr == "", check
    manage(venv, project, "makemigrations", "orders")
    manage(venv, project, "migrate", "--noinput", "-v0")

    orders = drive(venv, project, "orders")
    assert Path(orders["chokaq_core"]).is_relative_to(venv), orders  # the wheel's copy, never the checkout
    assert orders["rollback_status"] == 409 and orders["rolled_back_job"]
    assert orders["jobs_after_rollback"] == 0 and orders["orders_after_rollback"] == 0
    assert orders["commit_status"] == 201 and orders["jobs_after_commit"] == 1

    manage(venv, project, "chokaq_worker", "--burst")
    after = drive(venv, project, "after_worker", orders["job"])
    assert after["archived"] and after["confirmed"], after  # orders/jobs.py ran in the worker
    assert after["status"] == "SUCCEEDED" and after["queue"] == "orders" and after["unknown"], after

    deck = drive(venv, project, "superuser")
    assert deck["deck_status"] == 200
    assert deck["anonymous_location"].startswith("/deck/login/?next=")
    frame = websocket_frame_after_enqueue(venv, project, deck["session"])
    assert frame["job"] in frame["text"]


def websocket_frame_after_enqueue(venv: Path, project: Path, session: str) -> dict[str, str]:
    """Under the installed ``deck.serve`` (daphne, compressed frames), a logged-in websocket on /ws/deck/ receives
    a frame naming a job enqueued meanwhile (the client offers ``permessage-deflate`` and decodes it)."""
    import websockets.asyncio.client

    port = free_port()
    log = project / "daphne.log"
    with log.open("wb") as out:
        daphne = subprocess.Popen([str(venv / "bin" / "python"), "-m", "deck.serve", "-b", "127.0.0.1", "-p", str(port),
                                   f"{PROJECT}.asgi:application"], cwd=project, env=clean_env(), stdout=out,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    async def listen() -> dict[str, str]:
        url = f"ws://127.0.0.1:{port}/ws/deck/"
        headers = {"Cookie": f"sessionid={session}"}
        deadline = time.monotonic() + 60
        while True:  # daphne is starting
            try:
                socket = await websockets.asyncio.client.connect(url, additional_headers=headers,
                                                                 origin=f"http://127.0.0.1:{port}")  # type: ignore[arg-type]
                break
            except OSError:
                if time.monotonic() > deadline or daphne.poll() is not None:
                    raise
                await asyncio.sleep(0.2)
        async with socket:
            job = (await asyncio.to_thread(drive, venv, project, "enqueue"))["job"]
            while True:
                text = str(await asyncio.wait_for(socket.recv(), timeout=30))
                if job in text:
                    return {"job": job, "text": text}

    try:
        return asyncio.run(listen())
    except Exception as exc:
        raise AssertionError(f"no websocket frame: {exc!r}\n{log.read_text(errors='replace')[-3000:]}") from exc
    finally:
        daphne.terminate()
        daphne.wait(timeout=30)
