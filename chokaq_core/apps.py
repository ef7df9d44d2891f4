from __future__ import annotations

from django.apps import AppConfig


class ChokaQCoreConfig(AppConfig):
    name = "chokaq_core"
    label = "chokaq_core"
    verbose_name = "ChokaQ"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # backend: makes django.task: type keys resolvable (handlers.resolve_prefix)
        from chokaq_core import backend, checks, conf, handlers, heap, logs  # noqa: F401

        logs.install()
        checks.register()
        conf.validate()
        handlers.autodiscover()
        # Loading the engine compiled its modules (where no .pyc is kept): give that transient heap back now,
        # not whenever the process's own start-up ends (a worker's threads, a web server's first request).
        heap.release_free_heap()
