"""Errors a person can fix: the message names the fix, `code` is the exit status the
command line returns for it (`commviz.cli` prints `commviz: <message>`)."""

from __future__ import annotations


class CommvizError(Exception):
    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code
