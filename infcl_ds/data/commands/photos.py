"""`infcl-ds data photos`: JPEG shards of natural-looking images, made on the machine.

Benchmarks of decoding need what LAION-style shards hold: photographs stored with the shorter
side at 256-384 px as JPEG of quality ~90 (~20-40 KB each). Random noise compresses far worse
and decodes differently, so it would not do. Without a download, the photographs come from the
packages that ship some: scikit-learn's two sample images, scikit-image's data images where it
is installed, or any folder of images (`--photos`). Each sample is a random crop (scale and
aspect), flip and colour change of one of them, so every sample is a distinct image.

    infcl-ds data photos --out data/photos --samples 100000 --shard-size 5000
"""
import argparse
import io
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import List, Optional

import numpy as np
from PIL import Image, ImageEnhance

from ..errors import DataError
from .digits import make_output_dir

SCIKIT_IMAGE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "cat", "immunohistochemistry")


def bundled_photos() -> List[np.ndarray]:
    """RGB uint8 photographs shipped by installed packages (scikit-learn always, scikit-image
    where installed)."""
    from sklearn.datasets import load_sample_images
    photos = list(load_sample_images().images)
    try:
        import skimage.data
        for name in SCIKIT_IMAGE_PHOTOS:
            try:
                image = np.asarray(getattr(skimage.data, name)())
            except Exception:  # noqa: BLE001 - a data file that needs a download: skip it
                continue
            if image.ndim == 3 and image.shape[2] == 3 and min(image.shape[:2]) >= 256:
                photos.append(image.astype(np.uint8))
    except ImportError:
        pass
    return photos


def folder_photos(folder: Path) -> List[np.ndarray]:
    paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"))
    if not paths:
        raise SystemExit(f"data photos: no .jpg/.png/.webp images in {folder}")
    return [np.asarray(Image.open(p).convert("RGB")) for p in paths]


def make_sample(photo: np.ndarray, rng: np.random.Generator, shorter: int, quality: int) -> bytes:
    """One random view of `photo` as JPEG bytes: a crop of 10-100% of its area (aspect 3:4 to
    4:3), resized so the shorter side is `shorter`, maybe flipped, colour and contrast changed."""
    h, w = photo.shape[:2]
    area = rng.uniform(0.1, 1.0) * h * w
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    ch, cw = min(h, int(round(np.sqrt(area / aspect)))), min(w, int(round(np.sqrt(area * aspect))))
    y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    image = Image.fromarray(photo[y:y + ch, x:x + cw])
    scale = shorter / min(ch, cw)
    image = image.resize((max(shorter, round(cw * scale)), max(shorter, round(ch * scale))), Image.BICUBIC)
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    image = ImageEnhance.Color(image).enhance(rng.uniform(0.6, 1.4))
    image = ImageEnhance.Contrast(image).enhance(rng.uniform(0.7, 1.3))
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.8, 1.2))
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _write_shard(args) -> int:
    """Write shard `number`; returns its image bytes."""
    import webdataset as wds
    out, number, first, count, seed, photo_dir, shorter_range, quality = args
    photos = folder_photos(photo_dir) if photo_dir else bundled_photos()
    rng = np.random.default_rng((seed, number))
    total = 0
    with wds.TarWriter(str(Path(out) / f"shard-{number:06d}.tar")) as sink:
        for i in range(first, first + count):
            which = int(rng.integers(len(photos)))
            image = make_sample(photos[which], rng, int(rng.integers(*shorter_range)), quality)
            total += len(image)
            sink.write({"__key__": f"{i:09d}", "jpg": image,
                        "txt": f"a photograph, view {i} of picture {which}"})
    return total


def make_photo_shards(out, samples: int, shard_size: int, *, seed: int = 0, photos: Optional[Path] = None,
                      shorter=(256, 385), quality: int = 90, workers: Optional[int] = None) -> dict:
    """Write ceil(samples / shard_size) shards to `out`; returns a summary (also in
    `out/photos.json`): samples, shards, mean JPEG bytes per sample."""
    out = make_output_dir(out)
    tasks = [(str(out), n, first, min(shard_size, samples - first), seed, photos, shorter, quality)
             for n, first in enumerate(range(0, samples, shard_size))]
    with ProcessPoolExecutor(workers or os.cpu_count()) as pool:
        image_bytes = sum(pool.map(_write_shard, tasks))
    summary = {"samples": samples, "shards": len(tasks), "image_bytes_per_sample": image_bytes / samples,
               "shorter_side": [shorter[0], shorter[1] - 1], "jpeg_quality": quality}  # inclusive, as --shorter
    (out / "photos.json").write_text(json.dumps(summary, indent=1))
    return summary


def _side_range(text: str) -> tuple:
    """'MIN,MAX' -> (MIN, MAX + 1), the range make_sample's sides are drawn from."""
    try:
        low, high = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX in pixels, got {text!r}") from None
    if not 16 <= low <= high <= 8192:
        raise argparse.ArgumentTypeError(f"expected 16 <= MIN <= MAX <= 8192, got {text!r}")
    return low, high + 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="infcl-ds data photos", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory for the shards")
    p.add_argument("--samples", type=int, default=100_000, help="images written (default 100000)")
    p.add_argument("--shard-size", type=int, default=5_000, help="samples per shard (default 5000)")
    p.add_argument("--photos", type=Path, default=None, help="a folder of source images (default: bundled ones)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality (default 90)")
    p.add_argument("--shorter", type=_side_range, default=(256, 385), metavar="MIN,MAX",
                   help="shorter side in pixels, drawn from MIN to MAX (default 256,384: ~30 KB; 576,704 makes photos "
                        "of ~100 KB)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the images made (default 0)")
    p.add_argument("--workers", type=int, default=None, help="encoding processes (default: the CPU count)")
    args = p.parse_args(argv)
    try:
        summary = make_photo_shards(args.out, args.samples, args.shard_size, seed=args.seed, photos=args.photos,
                                    quality=args.quality, workers=args.workers, shorter=args.shorter)
    except (DataError, OSError) as err:  # a disk that fills, a folder that cannot be written
        print(f"infcl-ds data photos: {err}", file=sys.stderr)
        return 2
    print(f"{summary['samples']:,} samples in {summary['shards']} shards under {args.out}, "
          f"{summary['image_bytes_per_sample']:,.0f} JPEG bytes per sample")
    return 0
