"""Text a job's own code or a tenant wrote, made safe to show: in a job's status and Events, which `kubectl`,
the `dtjob` command-line tool and dashboards print on other people's terminals.

A container's termination message, a line of its log, a staging pod's report or a blob name may hold terminal
controls: an escape sequence that writes the reader's clipboard (OSC 52), hides a link (OSC 8) or moves the
cursor over earlier lines, the same as 8-bit C1 codes, a right-to-left override that shows text reversed, or
a lone surrogate that no API server stores as sent (the status would differ from what was written, each
reconcile). Each such character is written out as an escape (`\\x1b`, `\\u202e`) instead, so that the text is
still there to read, and does nothing. A newline stays: a traceback keeps its lines. Pure.
"""

from __future__ import annotations

import re
import unicodedata

# The categories of characters that do something rather than show: controls (C0, DEL, C1), format characters
# (bidi overrides, zero-width joiners), surrogates, and the line and paragraph separators.
_ACTING = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# What a terminal takes for colour and style: dropped, not escaped (they only paint).
_STYLE = re.compile(r"\x1b\[[0-9;]*m")


def printable(text: str, keep_newlines: bool = True) -> str:
    """`text` with every character that acts on a terminal written out as an escape; a tab becomes a space,
    terminal colours are dropped, and a newline stays unless `keep_newlines` is False."""
    if text.isascii() and text.isprintable():
        return text  # the common case, at C speed
    return "".join(_shown(char, keep_newlines) for char in _STYLE.sub("", text))


def _shown(char: str, keep_newlines: bool) -> str:
    if char == "\t":
        return " "
    if char == "\n" and keep_newlines:
        return char
    if unicodedata.category(char) not in _ACTING:
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
