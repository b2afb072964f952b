"""The one exception of the fold's rules, apart so that every module of rules can raise it."""

from __future__ import annotations


class Invalid(Exception):
    """Raised inside a handler to void the event; the message is the reason."""
