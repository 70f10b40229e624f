"""The one exception type users see for bad input."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# options a message may tell the user to give: (as Python's API reads it — the keyword, and the flag for whoever
# runs the command line — and as the command line shows it)
OPTIONS = {
    "resume": ("resume=True / --resume", "--resume"),
    "overwrite": ("overwrite=True / --overwrite", "--overwrite"),
    "out": ("out=… / --out", "--out"),
}


def option(name: str) -> str:
    """An option named inside a message, written once where the error is raised and shown in the words of
    whoever reads it: ``resume=True / --resume`` from Python, ``--resume`` on the command line (:data:`OPTIONS`)."""
    if name not in OPTIONS:
        raise KeyError(f"unknown option {name!r}: add it to slimjax.errors.OPTIONS")
    return f"\x00{name}\x00"


def _spelled(message: str, cli: bool) -> str:
    parts = message.split("\x00")
    return "".join(OPTIONS[p][cli] if k % 2 else p for k, p in enumerate(parts))


class SlimjaxError(ValueError):
    """Bad input: the message names the offending field and value."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {_spelled(message, cli=False)}")

    def cli_words(self, flags: dict[str, str]) -> str:
        """The error as the command line shows it: the field as the flag that sets it (``flags``: field ->
        flag, where one does) and the options the message names as flags."""
        return f"{flags.get(self.field, self.field)}: {_spelled(self.message, cli=True)}"


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
