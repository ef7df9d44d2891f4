"""URL passwords masked in a text (``scheme://user:***@host``): the one rule behind ``chokaq_core.redaction``."""

from __future__ import annotations

import re

MASK = "***"
# scheme://[user][:password]@ — the password is whatever follows the first ":" of the userinfo
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*):(?P<password>[^/\s]+)@")


def mask_credentials(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URL replaced by ``***``."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group('head')}:{MASK}@", text)
