"""Where ``infcl-ds export`` and ``infcl-ds eval`` write (``--out``): never into the checkpoints
they read, never over a file they did not write, and somewhere writable, all known before
any work.

``check_out_file`` is called before the checkpoint is read:

- ``--out``, resolved through symlinks and ``..``, must not lie inside the checkpoints that
  ``--checkpoint`` names (``export.checkpoints_of``): a run whose tag is overwritten can no
  longer resume;
- an existing ``--out`` must be a regular file that the same command wrote, as its
  ``is_ours`` recognises it (export: a flat dict of names to tensors; eval: a JSON object with
  ``"written_by": "infcl-ds eval"``). Running a command again to the same file replaces it;
  a mistyped path does not destroy a recipe, a metrics file or a checkpoint file;
- the directory it goes in (or the nearest existing one above it) must be a directory where a
  probe file can be created (a read-only file system, a path under a file).

``replace_file`` writes beside ``--out`` and renames: a failed write leaves no partial file
and is one line. An output that is a folder (``check_out_folder``, ``replace_folder``) follows
the same rules: an existing one is replaced only if the same command wrote it and everything
in it, and a new one is written whole beside it, then put in its place.
"""
import contextlib
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional, Set


class OutPathError(ValueError):
    """``--out`` names a place the command must not or cannot write; the message says why."""


def refuse_inside(out: Path, protected: Path) -> None:
    """``out`` (resolved: symlinks, ``..``) must not lie in ``protected`` (also resolved)."""
    real, guarded = Path(os.path.realpath(out)), Path(os.path.realpath(protected))
    if real.is_relative_to(guarded):
        shown = f"{out}" + (f" (that is {real})" if real != Path(os.path.abspath(out)) else "")
        raise OutPathError(f"--out {shown} is inside {protected}, the checkpoints that --checkpoint reads: writing "
                           f"there would damage them; name a file outside it")


def _foreign(out: Path, writer: str, what: str = "file") -> OutPathError:
    return OutPathError(f"--out {out} exists and was not written by {writer}: not replaced; remove it or name "
                        f"another {what}")


def refuse_foreign(out: Path, writer: str, is_ours: Callable[[Path], bool]) -> None:
    """An existing ``out`` must be a file that ``writer`` wrote (``is_ours``)."""
    if out.exists() and not is_ours(out):
        raise _foreign(out, writer)


def check_writable(out: Path) -> None:
    """The directory ``out`` goes in, or the nearest one above it that exists (the rest is
    created at the write), is a directory where a file can be created and removed."""
    existing = Path(os.path.abspath(out)).parent
    while not os.path.lexists(existing):
        existing = existing.parent
    if not existing.is_dir():
        raise OutPathError(f"--out {out}: {existing} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".infcl-ds-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutPathError(f"--out {out}: cannot write in {existing} ({err.strerror})") from None


def check_out_file(out, protected, writer: str, is_ours: Callable[[Path], bool], example: str) -> Path:
    """``out`` as a Path once the rules above hold for a single output file; OutPathError (a
    ValueError: one line) naming the rule otherwise. ``example``: a file name to suggest
    when ``out`` is a directory."""
    out = Path(out)
    refuse_inside(out, Path(protected))
    if out.exists() and not out.is_file():  # a directory, a device (/dev/full) or a FIFO
        if out.is_dir():
            raise OutPathError(f"--out {out} is a directory: name the file to write, e.g. {out / example}")
        raise OutPathError(f"--out {out} is not a regular file: name a file to write")
    refuse_foreign(out, writer, is_ours)
    check_writable(out)
    return out


def _one_line(out: Path, err: BaseException) -> OSError:
    why = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
    return OSError(f"--out {out}: writing failed ({why})")


def replace_file(out: Path, write: Callable[[Path], None]) -> None:
    """``write(partial)`` to a temporary file beside ``out``, then rename it over ``out``; any
    failure (a full disk: torch's writer reports a short write as a RuntimeError) removes the
    partial file and is one OSError naming ``--out``."""
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write(partial)
        os.replace(partial, out)
    except (OSError, RuntimeError) as err:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise _one_line(out, err) from None


def check_out_folder(out, protected, writer: str, files_of: Callable[[Path], Optional[Set[str]]]) -> Path:
    """``out`` as a Path once the rules above hold for an output folder; OutPathError (one line)
    naming the rule otherwise. ``files_of(folder)``: the names of the files an earlier run of
    ``writer`` put in ``folder``, None when it is not such a folder. An existing ``out`` is
    replaced only if it is one and holds nothing else: whatever was added to it would be lost."""
    out = Path(out)
    refuse_inside(out, Path(protected))
    if os.path.lexists(out) and not out.is_dir():
        if out.is_file():
            raise _foreign(out, writer)
        raise OutPathError(f"--out {out} is not a folder: name a folder to write")
    if out.is_dir():
        files = files_of(out)
        if files is None:
            raise _foreign(out, writer, "folder")
        extra = sorted(set(os.listdir(out)) - files)
        if extra:
            more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
            raise OutPathError(f"--out {out} holds {extra[0]}{more}, which {writer} did not write: not replaced; "
                               f"move it out or name another folder")
    check_writable(out)
    # A link to an earlier output: the folder it names is replaced, the link kept.
    return Path(os.path.realpath(out)) if out.is_symlink() else out


def _beside(out: Path, what: str) -> Path:
    """A fresh name in ``out``'s directory: hidden, and unique to this process and call."""
    return out.with_name(f".{out.name}.{what}-{os.getpid()}-{secrets.token_hex(4)}")


def _swap_in(new: Path, out: Path) -> None:
    """Put the folder ``new`` at ``out``. An earlier ``out`` is renamed aside first and removed
    after; if the second rename fails it is renamed back. Either way ``out`` is never a
    half-written folder: for the moment between the renames the name is absent."""
    if not os.path.lexists(out):
        os.rename(new, out)
        return
    earlier = _beside(out, "replaced")
    os.rename(out, earlier)
    try:
        os.rename(new, out)
    except OSError:
        os.rename(earlier, out)
        raise
    shutil.rmtree(earlier, ignore_errors=True)


def replace_folder(out: Path, write: Callable[[Path], None]) -> None:
    """``write(partial)`` fills a new folder beside ``out``, which then takes ``out``'s place
    (``_swap_in``). Any failure removes the partial folder, leaves an earlier ``out`` as it was
    and is one OSError naming ``--out`` (errors other than OSError and RuntimeError are bugs:
    they propagate, after the clean-up)."""
    partial = _beside(out, "partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(partial)  # not mkdtemp: its 0700 would become the published folder's mode
        write(partial)
        _swap_in(partial, out)
    except (OSError, RuntimeError) as err:
        raise _one_line(out, err) from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
