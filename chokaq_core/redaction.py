"""Credentials never leave the process in text: URLs lose their password in debug pages, logs and health output.

* :func:`mask_credentials` turns ``redis://:s3cret@cache:6379/0`` into ``redis://:***@cache:6379/0``
  (and ``postgres://app:pw@db/x`` into ``postgres://app:***@db/x``) wherever it occurs in a text.
* :class:`CredentialMaskingReporterFilter` is Django's ``SafeExceptionReporterFilter`` (settings named like
  ``*KEY*``/``*PASS*``/``*TOKEN*`` hidden) that also masks URL credentials in every other setting, request
  header and frame variable of a debug page or error e-mail: ``DEFAULT_EXCEPTION_REPORTER_FILTER =
  "chokaq_core.redaction.CredentialMaskingReporterFilter"``.
* :class:`CredentialMaskingExceptionReporter` masks the whole debug page / report text as a last pass (the
  exception message itself may name a URL): ``DEFAULT_EXCEPTION_REPORTER =
  "chokaq_core.redaction.CredentialMaskingExceptionReporter"``.
* :class:`CredentialMaskingLogFilter` masks the message and traceback of every record of the handler it is
  attached to (``LOGGING["filters"]``).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from django.utils.safestring import SafeString, mark_safe
from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

MASK = "***"
# scheme://[user][:password]@ — the password is whatever follows the first ":" of the userinfo
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*):(?P<password>[^/\s]+)@")


def mask_credentials(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URL replaced by ``***``."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group('head')}:{MASK}@", text)


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


class CredentialMaskingExceptionReporter(ExceptionReporter):
    """Django's debug page and error report with every URL password masked, the exception message included."""

    def get_traceback_html(self) -> SafeString:
        return mark_safe(mask_credentials(super().get_traceback_html()))  # masking keeps the page's escaping

    def get_traceback_text(self) -> SafeString:
        return mark_safe(mask_credentials(super().get_traceback_text()))


class CredentialMaskingLogFilter(logging.Filter):
    """Masks URL passwords in a record's message and traceback (the record is kept, never dropped)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_credentials(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_credentials(record.exc_text)
        return True
