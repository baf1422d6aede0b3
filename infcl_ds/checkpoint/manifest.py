"""What a complete checkpoint tag holds, written with it and checked before it is read.

``<tag>/manifest.json`` lists every file of the tag (DeepSpeed's, the client states, the
recipe) with its size and SHA-256, and the SHA-256 of the recipe the run had. It is written
by rank 0 once every rank has finished writing, before ``latest`` moves to the tag, so a tag
with a manifest that verifies is one that was complete; a truncated, garbled, missing or
added-after file is named before anything is unpickled. A manifest is read as untrusted
input: at most ``MAX_MANIFEST_BYTES``, and anything but the shape ``write_manifest`` writes
(too deep, wrong types, a name holding a NUL, one file listed under two spellings such as
``a.pt`` and ``./a.pt``) is a damaged manifest, one CheckpointError. Verifying reads each file
once, however many names lead to it (hard or symbolic links), so a manifest's size bounds the
names it lists, not the bytes hashed.

Nothing in a tag but regular files and directories is read: a FIFO blocks its reader until a
writer comes, a device may never end. ``verify`` looks at every entry's stat (never opens one)
and refuses a FIFO, socket or device, or a symbolic link to one, by name; every command that
reads a tag (resume, resharding, export, eval) verifies it first.
"""
import hashlib
import json
import os
import posixpath
import re
import stat
from pathlib import Path
from typing import Dict, List, Optional

from ..file_kind import file_kind
from ..shown import shown
from .atomic import atomic_write_bytes
from .safe_load import CheckpointError

MANIFEST = "manifest.json"
_BLOCK = 1 << 22
# About 150 bytes a file: room for a tag of tens of thousands of files (a ZeRO tag has a few
# per rank), and a bound on what a hostile manifest makes every rank read into memory.
MAX_MANIFEST_BYTES = 16 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _tag(tag_dir) -> str:
    """A tag in a message: its path with any line break or ESC escaped, as every name here."""
    return f"checkpoint {shown(tag_dir, quote=False)}"


def _named(name) -> str:
    return shown(name, quote=False)


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def _special_kind(path: Path) -> Optional[str]:
    """What ``path`` is, in words, when it is neither a regular file nor a directory, after its
    symbolic links ("a FIFO", "a symbolic link to a character device"); None otherwise, and for
    a path that resolves to nothing (the callers name a missing file themselves). Only stats."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing, a broken or looping link; a NUL in the name
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return f"{'a symbolic link to ' if path.is_symlink() else ''}{file_kind(mode)}"


def _refuse_if_not_readable(tag_dir: Path, name: str, path: Path) -> None:
    kind = _special_kind(path)
    if kind is not None:
        raise CheckpointError(f"{_tag(tag_dir)}: {_named(name)} is {kind}, not a regular file: refused")


def _tag_files(tag_dir: Path) -> List[Path]:
    return sorted(p for p in tag_dir.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.startswith("."))


def write_manifest(tag_dir: Path, recipe_sha256: str) -> None:
    tag_dir = Path(tag_dir)
    files = {p.relative_to(tag_dir).as_posix(): {"bytes": p.stat().st_size, "sha256": file_digest(p)}
             for p in _tag_files(tag_dir)}
    manifest = {"format": 1, "tag": tag_dir.name, "recipe_sha256": recipe_sha256, "files": files}
    atomic_write_bytes(tag_dir / MANIFEST, json.dumps(manifest, indent=1).encode())


def _is_entry(name: str, entry) -> bool:
    """One file of the tag as write_manifest lists it: {"bytes": int >= 0, "sha256": 64 hex
    digits}, under a name the file system can take (a NUL cannot; ``verify`` names one that
    points outside the tag)."""
    return ("\0" not in name and isinstance(entry, dict) and type(entry.get("bytes")) is int and entry["bytes"] >= 0
            and isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"]) is not None)


def read_manifest(tag_dir: Path) -> Dict:
    path = Path(tag_dir) / MANIFEST
    _refuse_if_not_readable(tag_dir, MANIFEST, path)
    if not path.is_file():
        raise CheckpointError(f"{_tag(tag_dir)} has no {MANIFEST}: incomplete, or not written by infcl-ds train")
    damaged = f"{_tag(tag_dir)}: {MANIFEST} is damaged"
    with open(path, "rb") as f:
        text = f.read(MAX_MANIFEST_BYTES + 1)  # bounded before parsing, whatever the file claims to be
    if len(text) > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{damaged} (more than {MAX_MANIFEST_BYTES >> 20} MiB; a manifest lists a tag's files)")
    try:
        manifest = json.loads(text)
    # RecursionError: nesting deeper than the parser's stack (a manifest is three levels deep).
    except (ValueError, RecursionError):
        raise CheckpointError(f"{damaged} (not JSON, or nested too deep)") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(_is_entry(name, entry) for name, entry in files.items()):
        raise CheckpointError(f"{damaged} (not the shape infcl-ds train writes)")
    spellings: Dict[str, str] = {}
    for name in files:
        first = spellings.setdefault(posixpath.normpath(name), name)
        if first != name:  # write_manifest lists each file once, as its path relative to the tag
            raise CheckpointError(f"{damaged} (it lists one file twice: {shown(first)} and {shown(name)})")
    return manifest


def verify(tag_dir: Path) -> Dict:
    """The tag's manifest, once nothing in the tag is a FIFO, socket or device, every file it
    lists has its size and digest and no ``.pt`` file beside them is unlisted; CheckpointError
    naming the first file that does not."""
    tag_dir = Path(tag_dir)
    manifest = read_manifest(tag_dir)
    # Every entry, listed or not: DeepSpeed's readers open the files their patterns match.
    for path in sorted(tag_dir.rglob("*")):
        _refuse_if_not_readable(tag_dir, path.relative_to(tag_dir).as_posix(), path)
    digests: Dict[tuple, str] = {}  # (device, inode) -> SHA-256
    for name, entry in manifest["files"].items():
        path = tag_dir / name
        if not path.resolve().is_relative_to(tag_dir.resolve()):
            raise CheckpointError(f"{_tag(tag_dir)}: {MANIFEST} names {_named(name)}, outside the tag")
        _refuse_if_not_readable(tag_dir, name, path)  # a name through a linked directory the walk skipped
        if not path.is_file():
            raise CheckpointError(f"{_tag(tag_dir)}: {_named(name)} is missing")
        info = path.stat()
        if info.st_size != entry.get("bytes"):
            raise CheckpointError(f"{_tag(tag_dir)}: {_named(name)} has {info.st_size} bytes, "
                                  f"{entry.get('bytes')} were written (truncated or replaced)")
        file = (info.st_dev, info.st_ino)
        if file not in digests:
            digests[file] = file_digest(path)
        if digests[file] != entry.get("sha256"):
            raise CheckpointError(f"{_tag(tag_dir)}: {_named(name)} does not match its SHA-256 (damaged or replaced)")
    unlisted = [p.relative_to(tag_dir).as_posix() for p in _tag_files(tag_dir)
                if p.suffix == ".pt" and p.relative_to(tag_dir).as_posix() not in manifest["files"]]
    if unlisted:
        names = ", ".join(_named(u) for u in unlisted)
        raise CheckpointError(f"{_tag(tag_dir)}: {names} not in its {MANIFEST} (added later)")
    return manifest
