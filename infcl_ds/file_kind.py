"""What a file that is not a regular one is, in words, for a message.

A FIFO blocks its reader until a writer comes, a device may never end: the readers of shards,
images and checkpoints look at a file's stat (never open it) and refuse these by name. Imports
nothing of the package: every layer uses it.
"""
import stat


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` (not a regular file's) is: "a FIFO", "a character device", ..."""
    return {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
            stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}.get(stat.S_IFMT(mode), "a special file")
