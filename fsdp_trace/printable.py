"""Text that came from an input (a trace's names, a path, a request's header), made safe to
print: no control character reaches the terminal.

A kernel or unit name, a file name or an HTTP header can hold escape sequences: OSC 52 writes
the user's clipboard, OSC 0 sets the window title, CSI 2J clears the screen; a newline would
break a one-line error in two; bidirectional overrides reorder what is shown. Each such
character is shown as its escape instead (`\\x1b`, `\\n`, `\\u202e`): the text stays readable and
a path stays typable, and nothing in it acts on the terminal.
"""

from __future__ import annotations

import re

# C0 controls (newline and tab included), DEL, C1 controls; the bidirectional embeddings,
# overrides and isolates; the line and paragraph separators; lone surrogates (a file name's
# bytes that are not UTF-8, as Python holds them: they cannot be encoded to print).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]")


def _shown(match: re.Match) -> str:
    char = match.group()
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # the byte os.fsdecode could not decode
        return f"\\x{code - 0xDC00:02x}"
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(
        char, f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    )


def printable(text: object) -> str:
    """`text` with every control character shown as its escape (see the module)."""
    text = str(text)
    return _UNSAFE.sub(_shown, text) if _UNSAFE.search(text) else text


def printable_lines(text: object) -> str:
    """As `printable`, keeping the newlines (text of several lines the tool wrote)."""
    return "\n".join(printable(line) for line in str(text).split("\n"))
