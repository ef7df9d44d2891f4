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

The two debug-page classes live in :mod:`chokaq_core.error_reports` and are named here on first use: a
``LOGGING`` filter imports this module in every process, and Django's debug views (their template engine and
tags: ~0.5 MiB of a running worker) are needed only where an error report is written.
"""

from __future__ import annotations

import logging
from typing import Any

from chokaq_core.masking import MASK as MASK
from chokaq_core.masking import mask_credentials as mask_credentials


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


class CredentialMaskingExceptionReporter:
    """Django's debug page and error report with every URL password masked, the exception message included
    (:class:`chokaq_core.error_reports.MaskingExceptionReporter`, built when a report is written)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from chokaq_core.error_reports import MaskingExceptionReporter

        return MaskingExceptionReporter(*args, **kwargs)


def __getattr__(name: str) -> Any:
    """``chokaq_core.redaction.CredentialMaskingReporterFilter`` / ``…ExceptionReporter`` (the settings' paths),
    imported from :mod:`chokaq_core.error_reports` when Django first asks for them."""
    if name == "CredentialMaskingReporterFilter":
        from chokaq_core import error_reports

        return getattr(error_reports, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
