from __future__ import annotations

from django.apps import AppConfig


class ChokaQCoreConfig(AppConfig):
    name = "chokaq_core"
    label = "chokaq_core"
    verbose_name = "ChokaQ"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # backend: makes django.task: type keys resolvable (handlers.resolve_prefix)
        from chokaq_core import backend, checks, conf, handlers, logs  # noqa: F401

        logs.install()
        checks.register()
        conf.validate()
        handlers.autodiscover()
