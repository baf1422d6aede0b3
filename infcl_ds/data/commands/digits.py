"""`infcl-ds data digits`: real image-text data without a download.

scikit-learn ships the UCI handwritten digits (1,797 8x8 grey images, 10 classes). This writes
them as WebDataset shards in img2dataset's layout ({key}.png, {key}.txt caption, {key}.json
{"label", "classname"}; key = 9-digit zero-padded index into the original dataset), with a fixed
stratified held-out split and the zero-shot prompts, so the whole train/zero-shot/retrieval path
runs end to end on any machine.
"""
import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from ...cli_args import ArgumentParser, positive_int, positive_number, whole_number_in
from ...shown import shown
from ..errors import DataError

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

# {word}: "seven", {digit}: "7". One template per sample, drawn from a seeded RNG.
CAPTION_TEMPLATES = (
    "a photo of the number {word}.",
    "a handwritten {digit}.",
    "the digit {word}.",
    "a drawing of the number {digit}.",
    "an image of a handwritten {word}.",
    "a scan of the handwritten digit {digit}.",
    "a small blurry picture of a {word}.",
    "the number {digit}, written by hand.",
)

ZEROSHOT_TEMPLATES = (
    "a photo of the number {}.",
    "a handwritten {}.",
    "the digit {}.",
    "a drawing of the number {}.",
    "an image of a handwritten {}.",
)

README = """\
Handwritten digits as image-text pairs, made by `infcl-ds data digits` from scikit-learn's
bundled copy of the UCI ML hand-written digits dataset (1,797 8x8 images of the digits 0-9, no
download): each image is scaled from intensities 0..16 to 0..255, upsampled bicubically to
{size}x{size} RGB PNG, and paired with a caption from a few templates ("the digit seven", "a
handwritten 7", ...). train/ and test/ are WebDataset shards in img2dataset's layout ({{key}}.png,
{{key}}.txt, {{key}}.json with "label" and "classname"); test/ is a fixed stratified
{holdout:.0%} hold-out (seed {seed}). zeroshot.json holds the class names and prompt templates
for zero-shot classification.
"""


def digit_image(pixels: np.ndarray, image_size: int) -> Image.Image:
    """8x8 intensities 0..16 -> an image_size square RGB image (bicubic)."""
    grey = Image.fromarray(np.round(pixels * (255 / 16)).astype(np.uint8))  # 2-D uint8: mode "L"
    return grey.resize((image_size, image_size), Image.Resampling.BICUBIC).convert("RGB")


IMAGE_FORMATS = ("png", "jpg")


def encoded_image(image: Image.Image, image_format: str) -> bytes:
    """PNG (lossless), or JPEG at quality 95 with 4:2:0 chroma (what photo shards hold, and what
    data.decoder=nvjpeg decodes on the GPU)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG" if image_format == "png" else "JPEG", quality=95)
    return buf.getvalue()


def write_split(folder: Path, indices, images, labels, templates, image_size: int, shard_size: int,
                image_format: str = "png") -> int:
    """Write the samples `indices` as folder/shard-NNNNNN.tar; returns the number of shards."""
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("shard-*.tar"):  # a rebuild with other sizes must not mix shards
        stale.unlink()
    with wds.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=shard_size, verbose=0) as sink:
        for i in sorted(indices):
            label = int(labels[i])
            sink.write({"__key__": f"{i:09d}", image_format: encoded_image(digit_image(images[i], image_size), image_format),
                        "txt": CAPTION_TEMPLATES[templates[i]].format(word=NUMBER_WORDS[label], digit=label),
                        "json": {"label": label, "classname": NUMBER_WORDS[label]}})
    return len(list(folder.glob("shard-*.tar")))


def make_output_dir(out) -> Path:
    """`out`, made if missing; DataError if it is something other than a directory."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot make the directory --out {out}: {e}") from None
    return out


def build_digits(out_dir, *, image_size: int = 32, seed: int = 0, holdout: float = 0.2,
                 shard_size: int = 500, image_format: str = "png") -> dict:
    """Write DIR/train, DIR/test, DIR/zeroshot.json and DIR/README.txt; return a summary."""
    out = make_output_dir(out_dir)  # before scikit-learn's import: a bad --out is said at once
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    n = len(digits.target)
    train, test = train_test_split(np.arange(n), test_size=holdout, stratify=digits.target,
                                   random_state=seed)
    templates = np.random.default_rng(seed).integers(len(CAPTION_TEMPLATES), size=n)
    shards = {name: write_split(out / name, idx, digits.images, digits.target, templates,
                                image_size, shard_size, image_format)
              for name, idx in (("train", train), ("test", test))}
    (out / "zeroshot.json").write_text(json.dumps(
        {"classnames": list(NUMBER_WORDS), "templates": list(ZEROSHOT_TEMPLATES)}, indent=1))
    (out / "README.txt").write_text(README.format(size=image_size, holdout=holdout, seed=seed))
    return {"out_dir": str(out), "image_size": image_size, "image_format": image_format, "classes": len(NUMBER_WORDS),
            "train_samples": len(train), "test_samples": len(test),
            "train_shards": shards["train"], "test_shards": shards["test"]}


# The digits are 8x8: a larger side only makes bigger files of the same blur, and 1,797 images
# of a huge side would fill the disk and memory before an error.
MAX_IMAGE_SIDE = 1024


def image_side(text: str) -> int:
    value = positive_int(text)
    if value > MAX_IMAGE_SIDE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_IMAGE_SIDE}, got {value}")
    return value


# 0 to 2**32 - 1: what both numpy's generators and scikit-learn's splits take.
split_seed = whole_number_in(0, 2**32 - 1, "2**32 - 1")


def holdout_fraction(text: str) -> float:
    """0.01 to 0.99: the split is stratified, so each side needs a sample of every digit (1,797
    samples, ~180 a digit)."""
    value = positive_number(text)
    if not 0.01 <= value <= 0.99:
        raise argparse.ArgumentTypeError(f"must be 0.01 to 0.99 (each split holds every digit), got {shown(text)}")
    return value


def main(argv=None) -> int:
    parser = ArgumentParser(
        prog="infcl-ds data digits",
        description="Write scikit-learn's handwritten digits as WebDataset image-text shards "
                    "(train/test split, zero-shot prompts); no download.")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--image-size", type=image_side, default=32,
                        help=f"side of the RGB PNGs, 1 to {MAX_IMAGE_SIDE} (default 32)")
    parser.add_argument("--seed", type=split_seed, default=0, help="split and caption seed (default 0)")
    parser.add_argument("--holdout", type=holdout_fraction, default=0.2,
                        help="held-out fraction, 0.01 to 0.99 (default 0.2)")
    parser.add_argument("--shard-size", type=positive_int, default=500, help="samples per shard (default 500)")
    parser.add_argument("--format", choices=IMAGE_FORMATS, default="png",
                        help="png (default), or jpg at quality 95 (for the GPU's JPEG decoder, data.decoder=nvjpeg)")
    args = parser.parse_args(argv)
    try:
        s = build_digits(args.out, image_size=args.image_size, seed=args.seed, holdout=args.holdout,
                         shard_size=args.shard_size, image_format=args.format)
    except (DataError, OSError) as err:  # a disk that fills, a folder that cannot be written
        print(f"infcl-ds data digits: {err}", file=sys.stderr)
        return 2
    print(f"digits: {s['train_samples']} train + {s['test_samples']} test samples "
          f"({s['train_shards']} + {s['test_shards']} shards, {s['image_size']}x{s['image_size']} RGB "
          f"{s['image_format'].upper()}) "
          f"in {s['out_dir']}")
    return 0
