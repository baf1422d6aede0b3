"""What the data subsystem costs, stated by it for the planner (plan/memory.py and plan/timing.py
compose it with the engine's): bytes per sample held on the host, the decode pool's window and
processes, the rows decoded on the GPU (its decoder's window, the chunks kept between the
passes), the measured decode rates, and the GPU's share of each chunk under data.decoder=hybrid.

Only `image_bytes_per_sample` and `jpeg_share` read files (the first shards' headers, the first
bytes of a few images); nothing here builds a source or starts a process.
"""
from typing import Optional, Tuple

from ..config.recipe import DataSection
from ..resources import read_json
from .decoding.decode_pool import DECODE_PIECE_ROWS, window_slots
from .errors import DataError

_OVERHEADS = read_json("calibration", "overheads.json")

# Finished tasks (pieces of data.worker_batch samples) each data-loader worker keeps ahead
# (torch's own default, stated here because the planner counts them).
WORKER_PREFETCH_FACTOR = 2
# Local batches a rank holds: the one training and the next, assembled meanwhile by a thread
# (train_stream.py's _AssembledAhead), when the caller drops each before asking for the next.
LOCAL_BATCHES_HELD = 2

# Encoded host batches (data/decoding/encoded.py). A stored image's size when neither the recipe
# (data.image_bytes) nor readable shards tell: JPEG at quality 90, shorter side 256-384 px, as
# `infcl-ds data photos` writes and LAION-style shards hold (33 KB measured on those shards;
# LAION-400M at img2dataset's defaults is ~10-30 KB).
DEFAULT_IMAGE_BYTES = 32 * 1024
# Per encoded row besides the image and its tokens: slot index and row table (piece, start, size).
ENCODED_ROW_BYTES = 8 + 4 + 8 + 8
# Per decode process: its own Python heap beyond the shared pages of the forked rank.
DECODE_WORKER_RESERVE = int(_OVERHEADS["decode_worker_reserve_gib"] * 2 ** 30)
# Shards read to measure the stored image size (their headers only: a few ms each).
SHARDS_SAMPLED = 4

# Decodes per second per decode process while a step trains, per data.decoder (open_clip's train
# transform, JPEG shards of 256-384 px): measured, with their source, in calibration/decode_rates.json.
_DECODE_RATES = read_json("calibration", "decode_rates.json")
DECODE_RATES_PER_WORKER = {name: float(_DECODE_RATES[f"{name}_per_process"]) for name in ("pil", "torchvision")}
# One GPU's decoder (data.decoder: nvjpeg; the GPU's share of hybrid) per data.gpu_jpeg_library,
# by its key in decode_rates.json: its decodes per second while the towers train
# (`<key>_per_gpu`), and how many times longer the towers' passes take while it decodes
# (`<key>_towers_slowdown`; 1 where not measured). `python -m infcl_ds.plan.calibrate --decode`
# writes both from benchmarks/decode.py's rows.
GPU_DECODER_KEYS = {"torchvision": "nvjpeg", "nvimgcodec": "nvimgcodec"}


def _lanes_measured(table: dict, lanes: int) -> Optional[float]:
    """`table`'s entry for the largest measured lane count up to `lanes` (more lanes than were
    measured add nothing known), None where it has none."""
    counts = [int(n) for n in table if int(n) <= lanes]
    return float(table[str(max(counts))]) if counts else None


def gpu_decode_rate(library: str = "torchvision", lanes: int = 1) -> float:
    """Decodes per second of one GPU's decoder through `library` (data.gpu_jpeg_library) with
    `lanes` decoding threads (data.gpu_decode_lanes): one lane's measured rate times the measured
    rate of that many lanes over one lane's, both from one run (`<key>_lanes_gain`, at least 1),
    and at most what that many lanes decoded (`<key>_lanes_per_gpu`): one lane's rate varies
    between runs, and a gain from a slow run's one lane must not lift a fast run's past it."""
    key = GPU_DECODER_KEYS[library]
    one = float(_DECODE_RATES[f"{key}_per_gpu"])
    gain = _lanes_measured(_DECODE_RATES.get(f"{key}_lanes_gain", {}), lanes) if lanes > 1 else None
    if gain is None:
        return one
    measured = _lanes_measured(_DECODE_RATES.get(f"{key}_lanes_per_gpu", {}), lanes)
    return max(one, one * gain if measured is None else min(one * gain, measured))


def gpu_decode_towers_slowdown(library: str = "torchvision", lanes: int = 1) -> float:
    """How many times longer the towers' passes take while `library`'s GPU decoder decodes with
    `lanes` threads: one lane's measured slowdown times that many lanes' over one lane's
    (`<key>_lanes_slowdown`, from one run)."""
    key = GPU_DECODER_KEYS[library]
    more = _lanes_measured(_DECODE_RATES.get(f"{key}_lanes_slowdown", {}), lanes) if lanes > 1 else None
    return float(_DECODE_RATES.get(f"{key}_towers_slowdown", 1.0)) * (more or 1.0)


def balanced_gpu_share(gpu_rate: float, cpu_rate: float, decodes: float = 0, processes_only: float = 0) -> float:
    """The GPU's share of each chunk with which the GPU decoder (`gpu_rate` rows/s) and the decode
    processes (`cpu_rate` together) finish at once: its share of their summed rate; where
    `processes_only` of a step's `decodes` are the processes' alone (the chunks the decode pool
    keeps between the passes), the share of the other chunks with which both finish the step at
    once, at most 1."""
    if not 0 < processes_only < decodes:
        return gpu_rate / (gpu_rate + cpu_rate)
    # share * split / gpu = ((1 - share) * split + processes_only) / cpu, split = decodes - processes_only
    return min(1.0, gpu_rate * decodes / ((decodes - processes_only) * (gpu_rate + cpu_rate)))


def hybrid_gpu_share(data: DataSection, decodes: int = 0, processes_only: int = 0) -> float:
    """The GPU's share of each chunk under data.decoder=hybrid (balanced_gpu_share) at the
    planned rates: the GPU decoder's (data.gpu_jpeg_library, data.gpu_decode_lanes) and
    data.decode_workers PIL processes'."""
    return balanced_gpu_share(gpu_decode_rate(data.gpu_jpeg_library, data.gpu_decode_lanes),
                              data.decode_workers * DECODE_RATES_PER_WORKER["pil"], decodes, processes_only)


def gpu_decode_share(data: DataSection) -> float:
    """The share of each chunk's rows the GPU decodes: all with data.decoder=nvjpeg; with hybrid,
    data.gpu_decode_share, `auto` as hybrid_gpu_share for data.decode_workers (a number); none
    with the CPU decoders or decoded host batches."""
    if data.host_batch == "decoded" or data.decoder not in ("nvjpeg", "hybrid"):
        return 0.0
    if data.decoder == "nvjpeg":
        return 1.0
    if data.gpu_decode_share == "auto":
        return hybrid_gpu_share(data)
    return data.gpu_decode_share


def kept_rows(gib, image_size: int, key: str = "data.keep_decoded_gib") -> int:
    """Rows whose decoded uint8 pixels fit in `gib` GiB (data.keep_decoded_gib, the decode windows);
    `key` names the recipe key in the error for an unresolved `auto`."""
    if gib == "auto":
        raise DataError(f"{key}=auto is resolved by the trainer (plan/auto_values.py) before the data is built: "
                        "pass a number")
    return int(gib * 2 ** 30) // (3 * image_size ** 2)


def pool_window_rows(data: DataSection, local: int, image_size: int) -> int:
    """Rows the decode processes may hold decoded ahead of the engine (data.decode_window_gib): at
    most two local batches, the one training and the next, the furthest the pool can decode."""
    return min(2 * local, kept_rows(data.decode_window_gib, image_size, "data.decode_window_gib"))


# data.gpu_decode_window_gib: auto where the planner finds no larger window worth its memory.
LANE_WINDOW_GIB = 4.0


def lane_window_gib(data: DataSection) -> float:
    """data.gpu_decode_window_gib, LANE_WINDOW_GIB for an `auto` the planner has not grown."""
    return LANE_WINDOW_GIB if data.gpu_decode_window_gib == "auto" else data.gpu_decode_window_gib


def device_window_rows(data: DataSection, local: int, image_size: int) -> int:
    """data.decoder nvjpeg and hybrid: rows the GPU decoder's lane may hold decoded ahead on the
    device (data.gpu_decode_window_gib; decoding/device_lane.py), at most its share of two local
    batches."""
    share = gpu_decode_share(data)
    if not share:
        return 0
    return min(2 * round(local * share), kept_rows(lane_window_gib(data), image_size))


def image_bytes_per_sample(data: DataSection) -> Tuple[int, str]:
    """(mean stored bytes of an image, where the figure comes from): data.image_bytes, else the
    image members of the first shards when they are readable here, else DEFAULT_IMAGE_BYTES."""
    if data.image_bytes:
        return data.image_bytes, "data.image_bytes"
    if data.source == "webdataset" and data.train:
        from .sources.tar_index import IMAGE, TarIndex
        from .sources.webdataset_source import expand_shards
        try:
            shards = expand_shards(data.train)[:SHARDS_SAMPLED]
            sizes = TarIndex(shards).spans[:, IMAGE, 1]
        except (DataError, OSError):
            pass
        else:
            sizes = sizes[sizes > 0]
            if len(sizes):
                return int(sizes.mean()), f"measured on {len(shards)} shard(s)"
    return DEFAULT_IMAGE_BYTES, "assumed; set data.image_bytes"


# Images whose first bytes `jpeg_share` reads: enough to tell JPEG shards from PNG ones.
IMAGES_SNIFFED = 64


def jpeg_share(data: DataSection) -> Optional[float]:
    """The share of JPEGs among the first IMAGES_SNIFFED images of the first shard (the GPU
    decoders take JPEGs only: PIL decodes the rest in the lane's one thread), or None where
    that is not known here (another source, shards not readable)."""
    if data.source != "webdataset" or not data.train:
        return None
    from .decoding.decode_pieces import JPEG_MAGIC
    from .sources.tar_index import IMAGE, shard_spans
    from .sources.webdataset_source import expand_shards
    try:
        shard = expand_shards(data.train)[0]
        spans = shard_spans(shard)[0][:, IMAGE]
        spans = spans[spans[:, 1] > 0][:IMAGES_SNIFFED]
        with open(shard, "rb") as f:
            starts = []
            for offset, _ in spans:
                f.seek(int(offset))
                starts.append(f.read(2))
    except (DataError, OSError, IndexError):
        return None
    return sum(start == JPEG_MAGIC for start in starts) / len(starts) if starts else None


def sample_host_bytes(data: DataSection, image_size: int, context_length: int, image_bytes: int) -> int:
    """One sample of a local batch in its host form: decoded uint8 pixels and int64 tokens, or
    the stored image bytes, int32 tokens and the row table."""
    if data.host_batch == "decoded":
        return 3 * image_size ** 2 + 8 * context_length
    return image_bytes + 4 * context_length + ENCODED_ROW_BYTES


def input_samples_held(data: DataSection, local: int) -> int:
    """Samples a rank holds on the host: the local batch training and the next, which a thread
    assembles meanwhile (train_stream.py; page-locked at exactly its size), and the pieces of
    data.worker_batch samples its data.workers have prefetched."""
    return LOCAL_BATCHES_HELD * local + data.workers * WORKER_PREFETCH_FACTOR * min(data.worker_batch, local)


def has_pool(data: DataSection) -> bool:
    """Whether decode processes decode the rank's rows (else the training process, the GPU, or
    the data workers do)."""
    return data.host_batch == "encoded" and bool(data.decode_workers) and data.decoder != "nvjpeg"


def host_kept_rows(data: DataSection, local: int, image_size: int, chunk: Optional[int], gpu_kept: int) -> int:
    """Rows of the local batch the decode pool keeps decoded from the first pass to the second
    (data.keep_decoded_host_gib): whole chunks of `chunk` rows (None: as many rows as it holds)
    right after the `gpu_kept` rows the GPU keeps; none without decode processes. With `hybrid`
    the processes decode these chunks alone (decoding/encoded.py's ChunkDecoder.split)."""
    if not has_pool(data):
        return 0
    gpu_kept = min(gpu_kept, local)
    rows = min(local - gpu_kept, kept_rows(data.keep_decoded_host_gib, image_size, "data.keep_decoded_host_gib"))
    return rows if chunk is None or gpu_kept + rows >= local else rows - rows % chunk


def decode_pool_bytes(data: DataSection, local: int, image_size: int, host_kept: int = 0) -> int:
    """The decode pool's shared memory per rank (encoded host batches; decoding/decode_pool.py):
    the rows its processes decode ahead (pool_window_rows) and the `host_kept` rows it keeps between
    the passes, at least two pieces per process; and each process's own heap."""
    if not has_pool(data):  # decoding in the training process or on the GPU: no window
        return 0
    workers = data.decode_workers
    rows = pool_window_rows(data, local, image_size) + host_kept
    return window_slots(rows, workers) * DECODE_PIECE_ROWS * 3 * image_size ** 2 + workers * DECODE_WORKER_RESERVE


def kept_pixel_rows(data: DataSection, local: int, image_size: int, chunk: int) -> int:
    """Rows of the local batch decoded once per step (data.keep_decoded_gib, resolved when
    auto: plan/auto_values.py): whole chunks of `chunk` rows, on the GPU between the passes."""
    if data.host_batch == "decoded":
        return 0
    rows = min(local, kept_rows(data.keep_decoded_gib, image_size))
    return rows if rows == local else rows - rows % chunk
