"""User values as error lines quote them: at most LIMIT characters, whatever was passed.

A recipe value, a --set argument, a CSV cell or a file's contents can be megabytes; an error
that repeats it whole is no longer one line anyone can read. A file name may hold a line break
or a terminal's escape sequence: shown unquoted, those are written as Python escapes, so the
line stays one line and the terminal shows them rather than obeys them. Imports nothing: every
layer uses it.
"""
LIMIT = 200


def shown(value, limit: int = LIMIT, quote: bool = True) -> str:
    """``repr(value)``, or its first ``limit`` characters, an ellipsis and the full length;
    with ``quote=False`` a string or path as it is (a path in a sentence), its characters that
    are not printable escaped as repr escapes them, cut the same way."""
    if hasattr(value, "__fspath__"):
        value = value.__fspath__()
    if isinstance(value, (str, bytes)):
        text = value if (isinstance(value, str) and not quote) else None
        if len(value) <= limit:
            return printable(text) if text is not None else repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        head = printable(text[:limit]) if text is not None else repr(value[:limit])
        return f"{head}... ({len(value):,} {unit})"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def printable(text: str) -> str:
    """`text` with each character that is not printable (a line break, ESC, a bidirectional
    override) written as its repr escape: `\\n`, `\\x1b`, `\\u202e`."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
