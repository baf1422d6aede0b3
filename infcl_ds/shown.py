"""User values as error lines quote them: at most LIMIT characters, whatever was passed.

A recipe value, a --set argument, a CSV cell or a file's contents can be megabytes; an error
that repeats it whole is no longer one line anyone can read. Imports nothing: every layer
uses it.
"""
LIMIT = 200


def shown(value, limit: int = LIMIT, quote: bool = True) -> str:
    """``repr(value)``, or its first ``limit`` characters, an ellipsis and the full length;
    with ``quote=False`` a string as it is (a path in a sentence), cut the same way."""
    if isinstance(value, (str, bytes)):
        text = value if (isinstance(value, str) and not quote) else None
        if len(value) <= limit:
            return text if text is not None else repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        head = value[:limit] if text is not None else repr(value[:limit])
        return f"{head}... ({len(value):,} {unit})"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"
