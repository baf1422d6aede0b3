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
from pathlib import Path

import numpy as np
from PIL import Image

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


def build_digits(out_dir, *, image_size: int = 32, seed: int = 0, holdout: float = 0.2,
                 shard_size: int = 500, image_format: str = "png") -> dict:
    """Write DIR/train, DIR/test, DIR/zeroshot.json and DIR/README.txt; return a summary."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    out = Path(out_dir)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="infcl-ds data digits",
        description="Write scikit-learn's handwritten digits as WebDataset image-text shards "
                    "(train/test split, zero-shot prompts); no download.")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--image-size", type=int, default=32, help="side of the RGB PNGs (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="split and caption seed (default 0)")
    parser.add_argument("--holdout", type=float, default=0.2, help="held-out fraction (default 0.2)")
    parser.add_argument("--shard-size", type=int, default=500, help="samples per shard (default 500)")
    parser.add_argument("--format", choices=IMAGE_FORMATS, default="png",
                        help="png (default), or jpg at quality 95 (for the GPU's JPEG decoder, data.decoder=nvjpeg)")
    args = parser.parse_args(argv)
    s = build_digits(args.out, image_size=args.image_size, seed=args.seed, holdout=args.holdout,
                     shard_size=args.shard_size, image_format=args.format)
    print(f"digits: {s['train_samples']} train + {s['test_samples']} test samples "
          f"({s['train_shards']} + {s['test_shards']} shards, {s['image_size']}x{s['image_size']} RGB "
          f"{s['image_format'].upper()}) "
          f"in {s['out_dir']}")
    return 0
