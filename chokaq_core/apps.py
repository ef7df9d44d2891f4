from __future__ import annotations

from django.apps import AppConfig


class ChokaQCoreConfig(AppConfig):
    name = "chokaq_core"
    label = "chokaq_core"
    verbose_name = "ChokaQ"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from chokaq_core import checks, conf, handlers, logs

        logs.install()
        checks.register()
        conf.validate()
        handlers.autodiscover()
