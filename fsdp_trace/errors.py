"""One exception type for problems the user can fix; the CLI prints it on one line and exits 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or configuration: the message says what is wrong and what to do."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is (as Ctrl-C raises KeyboardInterrupt), so that what
    it was writing is removed on the way out."""
