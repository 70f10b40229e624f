"""The one exception type users see for bad input."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class SlimjaxError(ValueError):
    """Bad input: the message names the offending field and value."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


def suggest(name: str, choices: Iterable[str], n: int = 3) -> str:
    """' (did you mean X, Y?)' for the closest known names, or ''."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    if not close:
        close = [lowered[c] for c in lowered if name.lower() in c][:n]
    else:
        close = [lowered[c] for c in close]
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
