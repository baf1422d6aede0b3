"""What a complete checkpoint tag holds, written with it and checked before it is read.

``<tag>/manifest.json`` lists every file of the tag (DeepSpeed's, the client states, the
recipe) with its size and SHA-256, and the SHA-256 of the recipe the run had. It is written
by rank 0 once every rank has finished writing, before ``latest`` moves to the tag, so a tag
with a manifest that verifies is one that was complete; a truncated, garbled, missing or
added-after file is named before anything is unpickled.
"""
import hashlib
import json
from pathlib import Path
from typing import Dict, List

from .atomic import atomic_write_bytes
from .safe_load import CheckpointError

MANIFEST = "manifest.json"
_BLOCK = 1 << 22


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def _tag_files(tag_dir: Path) -> List[Path]:
    return sorted(p for p in tag_dir.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.startswith("."))


def write_manifest(tag_dir: Path, recipe_sha256: str) -> None:
    tag_dir = Path(tag_dir)
    files = {p.relative_to(tag_dir).as_posix(): {"bytes": p.stat().st_size, "sha256": file_digest(p)}
             for p in _tag_files(tag_dir)}
    manifest = {"format": 1, "tag": tag_dir.name, "recipe_sha256": recipe_sha256, "files": files}
    atomic_write_bytes(tag_dir / MANIFEST, json.dumps(manifest, indent=1).encode())


def read_manifest(tag_dir: Path) -> Dict:
    path = Path(tag_dir) / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"checkpoint {tag_dir} has no {MANIFEST}: incomplete, or not written by infcl-ds train")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        # Each entry as write_manifest writes it: {"bytes": int, "sha256": str}.
        if not isinstance(files, dict) or not all(
                isinstance(e, dict) and type(e.get("bytes")) is int and isinstance(e.get("sha256"), str)
                for e in files.values()):
            raise TypeError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CheckpointError(f"checkpoint {tag_dir}: {MANIFEST} is damaged") from None
    return manifest


def verify(tag_dir: Path) -> Dict:
    """The tag's manifest, once every file it lists has its size and digest and no ``.pt``
    file beside them is unlisted; CheckpointError naming the first file that does not."""
    tag_dir = Path(tag_dir)
    manifest = read_manifest(tag_dir)
    for name, entry in manifest["files"].items():
        path = tag_dir / name
        if not path.resolve().is_relative_to(tag_dir.resolve()):
            raise CheckpointError(f"checkpoint {tag_dir}: {MANIFEST} names {name}, outside the tag")
        if not path.is_file():
            raise CheckpointError(f"checkpoint {tag_dir}: {name} is missing")
        if path.stat().st_size != entry.get("bytes"):
            raise CheckpointError(f"checkpoint {tag_dir}: {name} has {path.stat().st_size} bytes, "
                                  f"{entry.get('bytes')} were written (truncated or replaced)")
        if file_digest(path) != entry.get("sha256"):
            raise CheckpointError(f"checkpoint {tag_dir}: {name} does not match its SHA-256 (damaged or replaced)")
    unlisted = [p.relative_to(tag_dir).as_posix() for p in _tag_files(tag_dir)
                if p.suffix == ".pt" and p.relative_to(tag_dir).as_posix() not in manifest["files"]]
    if unlisted:
        raise CheckpointError(f"checkpoint {tag_dir}: {', '.join(unlisted)} not in its {MANIFEST} (added later)")
    return manifest
