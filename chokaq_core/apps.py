from __future__ import annotations

from django.apps import AppConfig

# The engine's largest modules, each after the large ones it imports (see heap.import_releasing): the dialect
# core (``chokaq_core.sql``, loaded here, called only by storage) before storage, so their compiles do not stack.
ENGINE_MODULES = ("chokaq_core.sql", "chokaq_core.policy", "chokaq_core.metrics", "chokaq_core.storage",
                  "chokaq_core.api", "chokaq_core.backend")


class ChokaQCoreConfig(AppConfig):
    name = "chokaq_core"
    label = "chokaq_core"
    verbose_name = "ChokaQ"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from chokaq_core import heap

        heap.import_releasing(ENGINE_MODULES)
        # backend: makes django.task: type keys resolvable (handlers.resolve_prefix)
        from chokaq_core import backend, checks, conf, handlers, logs  # noqa: F401

        logs.install()
        checks.register()
        conf.validate()
        handlers.autodiscover()
        # Loading the engine compiled its modules (where no .pyc is kept): give that transient heap back now,
        # not whenever the process's own start-up ends (a worker's threads, a web server's first request).
        heap.release_free_heap()
