from __future__ import annotations

from types import ModuleType

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.utils.connection import ConnectionDoesNotExist

# The engine's largest modules, each after the large ones it imports (see heap.import_releasing): the dialect
# core (``chokaq_core.sql``, loaded here, called only by storage) before storage, so their compiles do not stack.
ENGINE_MODULES = ("chokaq_core.sql", "chokaq_core.policy", "chokaq_core.metrics", "chokaq_core.storage",
                  "chokaq_core.api", "chokaq_core.backend")


class ChokaQCoreConfig(AppConfig):
    name = "chokaq_core"
    label = "chokaq_core"
    verbose_name = "ChokaQ"
    default_auto_field = "django.db.models.BigAutoField"

    def __init__(self, app_name: str, app_module: ModuleType | None) -> None:
        """The engine is loaded with the app configurations, before Django imports any app's models and runs
        the other apps' ``ready()`` (the admin's autodiscovery): its modules import no model, and where no
        ``.pyc`` is kept their compiles then peak over the small heap of that moment instead of over the whole
        project's, and leave less of it fragmented."""
        super().__init__(app_name, app_module)
        from chokaq_core import heap, storage

        heap.import_releasing(ENGINE_MODULES)
        try:
            storage.dialect()  # the vendor's dialect module (the largest compile after the core's)
        except (ImproperlyConfigured, ConnectionDoesNotExist):
            pass  # no such alias, its driver missing, an unsupported vendor: the system checks report it
        heap.release_free_heap()

    def ready(self) -> None:
        # backend: makes django.task: type keys resolvable (handlers.resolve_prefix)
        from chokaq_core import backend, checks, conf, handlers, heap, logs  # noqa: F401

        logs.install()
        checks.register()
        conf.validate()
        handlers.autodiscover()
        # Loading the project (its models, the other apps' ready()) freed heap: give it back now, not whenever
        # the process's own start-up ends (a worker's threads, a web server's first request).
        heap.release_free_heap()
