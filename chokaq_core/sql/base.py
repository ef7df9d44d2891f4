"""What every vendor dialect shares: the user-visible texts and the edit-version guard, written once.

The texts are stored in rows (error details of DLQ moves) or shown by the Deck, so every vendor must write
exactly the same words. The edit version (``revision``) makes an operator's edit a compare-and-set: each edit
names the revision it was made against, the statement bumps it, and a row whose revision moved on meanwhile
(another edit, a move between Hot and the DLQ, which carry it +1) matches nothing — the caller learns that
the edit was stale and nothing changed.
"""

from __future__ import annotations

ZOMBIE_DETAILS = "Zombie: Worker heartbeat expired during execution"
UNKNOWN_ERROR = "Unknown error (No details provided)"  # spec 01 §4.6: the text stored for empty details
EMPTY_ERROR = "(empty error details)"  # how top_errors names the group of rows without details
TOP_ERRORS_SAMPLE = 5000  # top_errors groups the newest this many DLQ rows (spec 01 §5)

REVISION_BUMP = "revision = revision + 1"
CARRIED_REVISION = "revision + 1"  # what a row moved between Hot and the DLQ keeps


def revision_guard(expected: str = "%s") -> str:
    """The predicate of a versioned edit: ``expected`` (a placeholder or variable holding the revision the
    edit was made against, NULL for an unversioned command) must equal the row's revision."""
    return f"revision = coalesce({expected}, revision)"


def error_details(text: str | None) -> str:
    """Error details as stored in a DLQ row: the default text for blank ones."""
    return text if text and text.strip() else UNKNOWN_ERROR


def cancel_details(actor: str | None) -> str:
    """Error details of an operator's cancellation."""
    return f"Cancelled by admin: {actor}" if actor else "Cancelled by admin (Batch)"
