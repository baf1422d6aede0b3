"""The one error type of the data layer."""


class DataError(ValueError):
    """Bad data or data configuration (missing path, empty shard list, missing CSV column,
    unusable samples, ...), with a message naming the path, key or rows."""
