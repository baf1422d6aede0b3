"""A CSV/TSV of image paths and captions (`data.source: csv`, OpenCLIP's `--dataset-type csv`):
the reader the trainer and `infcl-ds data check` share, the row checks, and CsvSource."""
import codecs
import csv
from pathlib import Path
from typing import Optional

from ...shown import shown
from ..errors import DataError
from .samples import (MAX_TEXT_BYTES, EncodedSample, Sample, SkipSample, decode_caption, decode_image, read_image_file,
                      require_image_bytes)

def csv_separator(path: Path, separator=None) -> str:
    """DataError if the CSV does not exist or `separator` is not one character (Python's csv
    reads no other); else `separator`, by default a tab for .tsv, a comma otherwise."""
    if not path.is_file():
        raise DataError(f"CSV file {shown(path, quote=False)} does not exist")
    if separator is None:
        separator = "\t" if path.suffix.lower() == ".tsv" else ","
    if not isinstance(separator, str) or len(separator) != 1:
        raise DataError(f"the separator of CSV {shown(path, quote=False)} must be one character, got "
                        f"{shown(separator)}")
    return separator


# Python's csv module refuses a field over 131,072 characters by default: a long caption (a
# scraped page) would pass the header check and then stop the trainer mid-read. Captions are
# cut to the tokenizer's context anyway; this bounds what one field may hold in memory while
# the file is parsed (a field past it stops the read, named by line), where a caption over
# MAX_TEXT_BYTES but under it only skips its row.
MAX_CSV_FIELD_CHARS = 1 << 20
# A UTF-8 byte order mark (Excel's "CSV UTF-8") is not part of the first column's name.
CSV_ENCODING = "utf-8-sig"
# How many bad rows a message names by line (it gives their count too).
ROWS_NAMED = 5


def open_csv(path: Path, mode: str, **kwargs):
    """`open`, with a file that cannot be read (permissions, a directory) a DataError naming it."""
    try:
        return open(path, mode, **kwargs)
    except OSError as e:
        raise DataError(f"cannot read CSV {shown(path, quote=False)}: {e.strerror or e}") from None


def scan_utf8(path: Path) -> int:
    """The file's number of newlines; DataError naming the line of its first byte that is not
    UTF-8. One pass over the bytes, 1 MiB at a time."""
    decoder, newlines = codecs.getincrementaldecoder(CSV_ENCODING)(), 0
    with open_csv(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                line = 1 + newlines + err.object[:err.start].count(b"\n")
                raise DataError(f"CSV {shown(path, quote=False)} is not UTF-8: byte {err.object[err.start]:#04x} "
                                f"on line {line}") from None
            newlines += block.count(b"\n")
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"CSV {shown(path, quote=False)} is not UTF-8: it ends inside a multi-byte character") from None
    return newlines


def csv_rows(path: Path, separator: str):
    """The CSV read as the trainer and `data check` both read it: UTF-8 with or without a byte
    order mark, fields of up to MAX_CSV_FIELD_CHARS, no NUL, no quote left open over rows; a
    row that breaks one is a DataError naming the file and the line it starts on. A context
    manager: ``with csv_rows(p, sep) as rows``; ``rows.header`` is the header's fields, and
    iterating gives (line, fields) for each row under it (blank lines are no rows)."""
    return _CsvRows(Path(path), separator)


class _CsvRows:
    def __init__(self, path: Path, separator: str):
        self.path, self.separator, self.header = path, separator, []

    def __enter__(self):
        csv.field_size_limit(MAX_CSV_FIELD_CHARS)
        self._file = open_csv(self.path, "r", newline="", encoding=CSV_ENCODING)
        try:
            self._reader = csv.reader(self._file, delimiter=self.separator)
            first = self._next_row()
        except BaseException:
            self._file.close()
            raise
        self.header = first[1] if first else []
        return self

    def __exit__(self, *exc):
        self._file.close()

    def __iter__(self):
        while (row := self._next_row()) is not None:
            yield row

    def _next_row(self):
        """(line, fields) of the next row that is not blank, or None at the end of the file."""
        while True:
            line = self._reader.line_num + 1  # where the next row starts (csv counts the lines it has read)
            try:
                fields = next(self._reader, None)
            except csv.Error as err:
                raise DataError(f"CSV {shown(self.path, quote=False)} line {line}: {self._malformed(err)}") from None
            except UnicodeDecodeError:
                scan_utf8(self.path)  # names the line
                raise DataError(f"CSV {shown(self.path, quote=False)} is not UTF-8") from None
            if fields is None:
                return None
            if fields:
                self._require_sound(line, fields)
                return line, fields

    def _malformed(self, err: csv.Error) -> str:
        if "field larger than field limit" in str(err):
            return (f"a field is longer than {MAX_CSV_FIELD_CHARS:,} characters (captions are cut to the tokenizer's "
                    "context anyway: shorten it; or is a quote opened there never closed?)")
        return str(err)

    def _require_sound(self, line: int, fields) -> None:
        if any("\0" in field for field in fields):
            raise DataError(f"CSV {shown(self.path, quote=False)} line {line}: holds a NUL byte (a binary file, or "
                            "UTF-16 text? save it as UTF-8 text)")
        end = self._reader.line_num
        if end > line and any(self._holds_rows(field) for field in fields):
            raise DataError(f"CSV {shown(self.path, quote=False)} line {line}: a quoted field opened on this line runs "
                            f"to line {end}, taking in what look like rows (lines holding the separator "
                            f"{shown(self.separator)}): a quote left unclosed? (a quote inside a quoted field is "
                            'written twice: "")')

    def _holds_rows(self, field: str) -> bool:
        """Whether a field that spans lines holds a line with a whole row's separators: a quote
        left open swallows the rows after it, where a caption's own line breaks rarely come
        with them."""
        needed = max(1, len(self.header) - 1)
        return any(part.count(self.separator) >= needed for part in field.split("\n")[1:])


def require_columns(path: Path, fields, keys, separator: str, hint: str = "") -> None:
    """DataError naming the `keys` missing from the CSV's header `fields`."""
    missing = [key for key in keys if key not in (fields or [])]
    if missing:
        raise DataError(f"CSV {shown(path, quote=False)} lacks column(s) {missing} (has {shown(fields)}, separator "
                        f"{shown(separator)}){hint}")


def require_rows(path: Path, rows: int) -> None:
    if not rows:
        raise DataError(f"CSV {shown(path, quote=False)} has no rows under its header")


class CsvColumns:
    """Where a CSV's image and caption columns lie, and what makes one of its rows unusable."""

    def __init__(self, header, img_key: str, caption_key: str):
        self.width, self.image, self.caption = len(header), header.index(img_key), header.index(caption_key)

    def problem(self, fields) -> Optional[str]:
        """Why the trainer skips this row, or None."""
        if len(fields) != self.width:
            return f"{len(fields)} field(s) where the header has {self.width}"
        if not fields[self.image].strip():
            return "no image path"
        caption = fields[self.caption]
        if not caption.strip():
            return "empty caption"
        # len() counts characters: bytes are at most 4 of them, so most captions skip the encode.
        size = len(caption.encode()) if len(caption) > MAX_TEXT_BYTES // 4 else 0
        if size > MAX_TEXT_BYTES:
            return f"a caption of {size:,} bytes, over the limit of {MAX_TEXT_BYTES:,} (MAX_TEXT_BYTES)"
        return None


def bad_rows_message(path: Path, count: int, total: int, first) -> str:
    """One line: `count` bad rows of `total`, the `first` (line, why) of them named."""
    named = ", ".join(f"line {line} ({why})" for line, why in first)
    more = f", and {count - len(first):,} more" if count > len(first) else ""
    return f"CSV {shown(path, quote=False)}: {count:,} of {total:,} row(s) the trainer skips and counts: {named}{more}"


class CsvSource:
    """A CSV/TSV (OpenCLIP's `--dataset-type csv`): rows of `img_key` (image path; relative paths
    are relative to the CSV's directory) and `caption_key`. A row the trainer cannot use (a
    field count other than the header's, no image path, an empty caption or one over
    MAX_TEXT_BYTES: CsvColumns.problem) is skipped, as is a missing or undecodable image file,
    or one that is not a regular file of at most MAX_IMAGE_BYTES, at load time: checking
    millions of files at build time would be slow. `infcl-ds data check` names them."""

    def __init__(self, path, img_key: str, caption_key: str, separator=None):
        path = Path(path)
        separator = csv_separator(path, separator)
        self.images, self.captions = [], []
        self.unusable = {}  # row -> why it is skipped
        with csv_rows(path, separator) as rows:
            require_columns(path, rows.header, (img_key, caption_key), separator)
            columns = CsvColumns(rows.header, img_key, caption_key)
            for _, fields in rows:
                why = columns.problem(fields)
                if why is None:
                    self.images.append(fields[columns.image])
                    self.captions.append(fields[columns.caption])
                else:  # kept as a row (the sampler's numbering is the file's), its fields not kept
                    self.unusable[len(self.images)] = why
                    self.images.append("")
                    self.captions.append("")
        require_rows(path, len(self.images))
        self.root = path.parent

    def __len__(self) -> int:
        return len(self.images)

    def load(self, index: int) -> Sample:
        sample = self.load_encoded(index)
        return Sample(decode_image(sample.image), sample.caption)

    def load_encoded(self, index: int) -> EncodedSample:
        why = self.unusable.get(index)
        if why is not None:
            raise SkipSample(why)
        caption = decode_caption(self.captions[index])
        return EncodedSample(require_image_bytes(read_image_file(self.root / self.images[index])), caption)
