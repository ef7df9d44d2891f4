"""Django's debug page and error report with every URL password masked (named in settings as ``chokaq_core.redaction.…``)."""

from __future__ import annotations

from typing import Any

from django.utils.safestring import SafeString, mark_safe
from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

from chokaq_core.masking import mask_credentials


def _masked(value: Any) -> Any:
    return mask_credentials(value) if isinstance(value, str) else value


class CredentialMaskingReporterFilter(SafeExceptionReporterFilter):
    """Debug pages and error reports: Django's hidden settings, and no URL password anywhere else."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        return _masked(super().cleanse_setting(key, value))

    def get_traceback_frame_variables(self, request: Any, tb_frame: Any) -> Any:
        return [(name, _masked(value) if isinstance(value, str) else _RedactedRepr.wrap(value))
                for name, value in super().get_traceback_frame_variables(request, tb_frame)]


class _RedactedRepr:
    """A frame variable whose repr has a URL password masked (the debug page shows ``repr(value)``)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    @classmethod
    def wrap(cls, value: Any) -> Any:
        try:
            text = repr(value)
        except Exception:
            return value
        return cls(value) if mask_credentials(text) != text else value

    def __repr__(self) -> str:
        return mask_credentials(repr(self.value))


class MaskingExceptionReporter(ExceptionReporter):
    """Django's debug page and error report with every URL password masked, the exception message included."""

    def get_traceback_html(self) -> SafeString:
        return mark_safe(mask_credentials(super().get_traceback_html()))  # masking keeps the page's escaping

    def get_traceback_text(self) -> SafeString:
        return mark_safe(mask_credentials(super().get_traceback_text()))
