"""The base class of every error a user can fix.

Its message names the bad thing and what to do about it; the CLI shows it as
one line (no traceback) and exits 1.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or environment; the message says what and where, and what to do."""
