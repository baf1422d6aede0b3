"""The one error type of the data layer."""


class DataError(ValueError):
    """Bad data configuration (missing path, empty shard list, missing CSV column, ...).

    Raised at build time, before any training step, with a message naming the path or key.
    """
