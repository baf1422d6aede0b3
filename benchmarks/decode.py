"""`python -m benchmarks.decode`: the GPU decoder's own rows of docs/benchmarks/decode.json (+ PNG).

    python -m benchmarks.decode --shards photos=/tmp/infcl-ds-photos,large=/tmp/infcl-ds-photos-large

For each shard folder and each decoder — torchvision's nvJPEG binding, nvImageCodec with the
backends the trainer gives it (hardware JPEG decoder, then CUDA, then hybrid) and with each of
those backends alone — the images decoded and cropped per second through the trainer's own piece
decoder (BatchedDevicePieces: one batched decode of a 1,024-image piece, the crop draws, one
crop-and-resize launch, on a stream of its own), and the host time per image: this process's CPU
seconds while it decoded, over the images. Each twice: alone, and beside training, where a thread
runs a tower's forward and backward (bf16, the trainer's chunk) on the same GPU; the tower's
rate alone and beside the decoder says what decoding costs a step (`towers_slowdown`). Beside
training the towers' own CPU time (their rate of it alone) is taken off the host figure.
With `--towers-process` the tower runs in a process of its own on the same GPU: the decoder and
the tower then share the GPU but not an interpreter lock, which tells the two costs apart.

nvImageCodec tries its backends in order and does not say which decoded an image, so the
one-backend rows say it: `decoded_by_backend` counts the images that backend decoded itself
(the rest go to PIL, as in training). The hardware rows keep the library's own log of a decode at
PYNVIMGCODEC_VERBOSITY=3 (`library_log`): the hardware engines it found ("HW decoder available
num_hw_engines=..." or "not supported by this platform") and each image it passed on ("failed #i.
Trying next"); release builds do not log the finer reasons. For JPEG, nvImageCodec's CUDA
nvJPEG decoder is its hybrid backend: the `cuda` row is expected to decode none itself.

Whole steps beside them (`--steps-from`): the rows of `infcl-ds bench train --data
synthetic,jpeg` (one GPU held to a few cores with taskset) and of benchmarks/scale.py's parts
that set a decoder, each JPEG row with its synthetic rate from the same run (`vs_synthetic`), the
decoder `auto` chose and the plan's reason (`auto_line`).

On a CPU the same code runs with the libraries' CPU decoders and a tiny tower (the tests): the
machinery, not figures.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional

from infcl_ds.config.recipe import DataSection
from infcl_ds.data.decoding.nvimgcodec_decode import GPU_BACKENDS

from .common import run_identity, write_rows
from .proc_cpu import thread_cpu_s

# A scale part that does not set data.gpu_jpeg_library runs the recipe's default.
DEFAULT_GPU_JPEG_LIBRARY = DataSection.model_fields["gpu_jpeg_library"].default

DEFAULT_OUT = Path("docs/benchmarks/decode.json")
PIECE = 1024         # images per batched decode: the lane's piece (data/decoding/decode_pool.py's rows)
IMAGE_SIZE = 224
# nvImageCodec's backend sets, by row name: the trainer's, then each backend alone.
NVIMGCODEC_BACKENDS = {"trainer's": GPU_BACKENDS, "hardware": ("HW_GPU_ONLY",), "cuda": ("GPU_ONLY",),
                       "hybrid": ("HYBRID_CPU_GPU",)}
# The trainer's set again with this many CPU threads (the library's default is one per core of the
# machine, which a rank shares with its decode processes, the other ranks and the towers' thread).
FEW_CPU_THREADS = 2


def blobs_from(shard_dir: Path, n: int) -> List[bytes]:
    """The first `n` JPEGs of the shards in `shard_dir` (shard-*.tar), as bytes."""
    blobs = []
    for shard in sorted(Path(shard_dir).glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.name.endswith(".jpg"):
                    blobs.append(tar.extractfile(member).read())
                    if len(blobs) == n:
                        return blobs
    if not blobs:
        raise SystemExit(f"no JPEGs in {shard_dir}/shard-*.tar: make them with `infcl-ds data photos --out {shard_dir}`")
    return blobs


@lru_cache(maxsize=None)
def tower_and_chunk(model: str, chunk: int, device: str, compiled: bool):
    """`model`'s image tower on `device` (compiled once, where asked) and a random chunk for it:
    one per process, shared by every row's thread."""
    import torch

    from infcl_ds.models import create_model
    tower = create_model(model, seed=0).visual.to(device)
    if compiled:  # as the trainer runs its towers: far fewer launches from Python
        tower = torch.compile(tower)
    size = tower.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    return tower, torch.randn(chunk, 3, size, size, device=device)


class Towers(threading.Thread):
    """A tower's forward and backward on one random chunk, over and over until `stop` is set,
    on `device`'s default stream (the decoder has a stream of its own): each finished pass's end
    time."""

    def __init__(self, model: str, chunk: int, device, compiled: bool = False):
        import torch
        super().__init__(daemon=True, name="towers")
        self.device, self.chunk = torch.device(device), chunk
        self.tower, self.images = tower_and_chunk(model, chunk, str(self.device), compiled)
        self.stop, self.ends, self.tid = threading.Event(), [], None

    def one_pass(self) -> None:
        import torch
        cuda = self.device.type == "cuda"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cuda):
            out = self.tower(self.images)
        out.float().square().mean().backward()
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def run(self) -> None:
        import torch
        self.tid = threading.get_native_id()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while not self.stop.is_set():
            self.one_pass()
            self.ends.append(time.perf_counter())

    def rate(self, start: float, end: float) -> Optional[float]:
        """Samples/s of the passes that ended within [start, end], from the one that ended first."""
        ends = [t for t in self.ends if start <= t <= end]
        return (len(ends) - 1) * self.chunk / (ends[-1] - ends[0]) if len(ends) > 1 else None


class TowersProcess:
    """Towers' passes in a process of their own on the same GPU (`--towers-process`): what the
    decoder keeps beside training when the two do not share an interpreter lock. Its passes' end
    times come back on its stdout (perf_counter is the system's monotonic clock: one timeline)."""

    def __init__(self, model: str, chunk: int, device, compiled: bool = False):
        self.args, self.chunk = (model, chunk, str(device), compiled), chunk
        self.ends, self.tid, self.process, self.reader = [], None, None, None

    def start(self, warm_passes: int = 2) -> None:
        code = "import sys; from benchmarks.decode import towers_loop; towers_loop(*eval(sys.argv[1]))"
        self.process = subprocess.Popen([sys.executable, "-c", code, repr(self.args)], stdout=subprocess.PIPE,
                                        text=True, cwd=Path(__file__).resolve().parents[1])
        seen = 0
        for line in self.process.stdout:  # untimed passes first: kernels chosen, memory grown
            seen += 1
            if seen >= warm_passes:
                break
        if seen < warm_passes:
            raise SystemExit(f"the towers' process ended (status {self.process.wait()}); its error is above")
        self.reader = threading.Thread(target=lambda: self.ends.extend(float(t) for t in self.process.stdout),
                                       daemon=True)
        self.reader.start()

    def join(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self.reader.join(timeout=10)

    rate = Towers.rate


def towers_loop(model: str, chunk: int, device: str, compiled: bool) -> None:
    """TowersProcess's child: passes until terminated, each one's end time on a line of stdout."""
    import torch
    towers = Towers(model, chunk, device, compiled)
    if towers.device.type == "cuda":
        torch.cuda.set_device(towers.device)
        torch.backends.cuda.matmul.allow_tf32 = True
    while True:
        towers.one_pass()
        print(time.perf_counter(), flush=True)


def tower_runner(model: str, chunk: int, device, compiled: bool, in_process: bool):
    """A started run of towers' passes beside whatever this process does next (a thread of this
    process or, `in_process` False, a process of its own), warmed; `stop_towers` ends it."""
    if not in_process:
        towers = TowersProcess(model, chunk, device, compiled)
        towers.start()
        return towers
    towers = Towers(model, chunk, device, compiled)
    for _ in range(2):  # untimed: kernels chosen, memory grown
        towers.one_pass()
    towers.start()
    return towers


def stop_towers(towers) -> None:
    if isinstance(towers, Towers):
        towers.stop.set()
    towers.join()


def towers_alone(model: str, chunk: int, device, seconds: float, compiled: bool = False,
                 in_process: bool = True) -> dict:
    """The towers' samples/s and this process's CPU seconds per second with nothing else running."""
    towers = tower_runner(model, chunk, device, compiled, in_process)
    time.sleep(min(seconds, 1.0))
    start, cpu = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    end, cpu_s = time.perf_counter(), time.process_time() - cpu
    stop_towers(towers)
    rate = towers.rate(start, end)
    if rate is None:
        raise SystemExit(f"the {model} tower finished fewer than two passes in {seconds:g} s: a longer --seconds, "
                         "or its thread failed (its error is above)")
    # a process of their own: this process's CPU time is not theirs
    return {"samples_per_s": rate, "cpu_per_s": cpu_s / (end - start) if in_process else None}


def blocking_sync() -> None:
    """This process's CUDA waits sleep rather than spin (each GPU's primary context made with
    CU_CTX_SCHED_BLOCKING_SYNC, before torch makes it), so that a wait inside a library's call is
    not counted as its host work (`--blocking-sync`)."""
    import ctypes
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        raise SystemExit(f"--blocking-sync needs the CUDA driver (libcuda.so.1): {err}") from None
    set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or cuda.cuDevicePrimaryCtxSetFlags
    count, device = ctypes.c_int(), ctypes.c_int()
    for what, rc in (("cuInit", lambda: cuda.cuInit(0)), ("cuDeviceGetCount", lambda: cuda.cuDeviceGetCount(
            ctypes.byref(count)))):
        if rc() != 0:
            raise SystemExit(f"--blocking-sync: {what} failed")
    for ordinal in range(count.value):
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0 or set_flags(device, 0x4) != 0:
            raise SystemExit(f"--blocking-sync: GPU {ordinal}'s primary context flags could not be set "
                             "(torch made the context first?)")


def piece_decoder(library: str, backends, device, cpu_threads: Optional[int] = None, stream_priority: int = 0):
    """The trainer's piece decoder with `library`'s JPEG decoder (nvImageCodec limited to
    `backends` and `cpu_threads`), its stream at `stream_priority`."""
    from infcl_ds.data.decoding.device_decode import BatchedDevicePieces
    from infcl_ds.data.decoding.nvimgcodec_decode import NvImageCodecJpegs
    from infcl_ds.data.decoding.transforms import uint8_image_transform
    transform = uint8_image_transform(IMAGE_SIZE, augment=True)
    jpegs = NvImageCodecJpegs(device, backends=backends, cpu_threads=cpu_threads) if library == "nvimgcodec" else None
    return BatchedDevicePieces(transform, 0, device, library=library, jpegs=jpegs, stream_priority=stream_priority)


class PhaseClock:
    """Wall and CPU seconds of the decoding threads in each part of the piece decoder (its parts
    wrapped for one timed run): where their host time goes, and how much of it is waiting."""
    PHASES = ("jpeg library", "crop draws", "crop launch", "waiting for the GPU")

    def __init__(self):
        self.wall = dict.fromkeys(self.PHASES, 0.0)
        self.cpu = dict.fromkeys(self.PHASES, 0.0)
        self._lock = threading.Lock()

    def timed(self, phase: str, fn):
        def wrapped(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
                with self._lock:
                    self.wall[phase] += wall
                    self.cpu[phase] += cpu
        return wrapped

    def per_image_us(self, images: int) -> dict:
        return {phase: {"wall": self.wall[phase] / images * 1e6, "cpu": self.cpu[phase] / images * 1e6}
                for phase in self.PHASES}


def decode_in_order(pieces, blobs: List[bytes], rows0: List[int], wait, piece: int = PIECE) -> None:
    """The pieces of `blobs` that start at `rows0` decoded and cropped, the next piece queued
    before waiting for the last one's event (the lane's overlap of host and GPU work)."""
    previous = None
    for row0 in rows0:
        part = blobs[row0:row0 + piece]
        _, event = pieces.decode((row0, part, 0, list(range(row0, row0 + len(part)))))
        if previous is not None:
            wait(previous)
        previous = event
    if previous is not None:
        wait(previous)


def decode_all(decoders, blobs: List[bytes], clock: Optional[PhaseClock] = None, piece: int = PIECE) -> float:
    """Every `piece` images of `blobs` decoded and cropped by `decoders` (one piece decoder, or a list:
    each on a thread of its own with every len(decoders)-th piece, as lanes decoding side by
    side; one alone on a thread of its own too, as the trainer's lane: the main thread's work
    would draw in torch's worker threads). `clock`: the parts timed. The decoding threads' CPU seconds."""
    decoders = decoders if isinstance(decoders, list) else [decoders]
    wait = (lambda event: event.synchronize()) if clock is None else clock.timed("waiting for the GPU",
                                                                                 lambda event: event.synchronize())
    rows0 = list(range(0, len(blobs), piece))
    cpu, errors = [], []

    def lane(k: int) -> None:
        mine = time.thread_time()
        try:
            decode_in_order(decoders[k], blobs, rows0[k::len(decoders)], wait, piece)
        except BaseException as err:  # noqa: BLE001 - raised below, on the caller's thread
            errors.append(err)
        cpu.append(time.thread_time() - mine)
    threads = [threading.Thread(target=lane, args=(k,), name=f"decode-{k}") for k in range(len(decoders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return sum(cpu)


def timed_decode(decoders, blobs: List[bytes], towers_tid: Optional[int] = None, piece: int = PIECE) -> dict:
    """One timed run of decode_all: its wall time, and the CPU seconds of the decoding threads
    (by part: PhaseClock), of the towers' thread (`towers_tid`) and of every other thread of this
    process (the library's and CUDA's), read from /proc."""
    from infcl_ds.data.decoding import device_decode
    decoders = decoders if isinstance(decoders, list) else [decoders]
    clock = PhaseClock()
    saved = [(pieces.jpegs, pieces.geometry.boxes) for pieces in decoders], device_decode.resized_crops
    for pieces in decoders:
        pieces.jpegs = clock.timed("jpeg library", pieces.jpegs)
        pieces.geometry.boxes = clock.timed("crop draws", pieces.geometry.boxes)
    device_decode.resized_crops = clock.timed("crop launch", device_decode.resized_crops)
    try:
        threads_before = thread_cpu_s(os.getpid())
        start, cpu = time.perf_counter(), time.process_time()
        mine_s = decode_all(decoders, blobs, clock, piece)
        end, cpu_s = time.perf_counter(), time.process_time() - cpu
        threads_after = thread_cpu_s(os.getpid())
    finally:
        for pieces, (jpegs, _) in zip(decoders, saved[0]):
            pieces.jpegs = jpegs
            if "boxes" in vars(pieces.geometry):
                del pieces.geometry.boxes
        device_decode.resized_crops = saved[1]
    delta = {tid: threads_after[tid][1] - threads_before.get(tid, ("", 0.0))[1] for tid in threads_after}
    # the tower's backward runs on torch's autograd threads (pt_autograd_N), not on its own
    towers_s = 0.0 if towers_tid is None else delta.get(towers_tid, 0.0) + sum(
        cpu for tid, cpu in delta.items() if threads_after[tid][0].startswith("pt_autograd"))
    return {"start": start, "end": end, "seconds": end - start, "cpu_s": cpu_s, "decoding_thread_s": mine_s,
            "towers_thread_s": towers_s, "other_threads_s": max(cpu_s - mine_s - towers_s, 0.0),
            "phases": clock}


def decoded_by_backend(library: str, backends, device, blobs: List[bytes]) -> Optional[int]:
    """How many of `blobs` nvImageCodec's `backends` decode themselves (None: another library)."""
    if library != "nvimgcodec":
        return None
    from infcl_ds.data.decoding.nvimgcodec_decode import NvImageCodecJpegs
    jpegs = NvImageCodecJpegs(device, backends=backends)
    return sum(image is not None for row0 in range(0, len(blobs), PIECE)
               for image in jpegs.decoded(blobs[row0:row0 + PIECE]))


def library_log(shard_dir: Path, backends, device, images: int = 64) -> str:
    """nvImageCodec's own log (PYNVIMGCODEC_VERBOSITY=3: warnings) of decoding `images` of the
    shards with `backends`, in a process of its own (the level is read when the module loads)."""
    code = ("import sys; from benchmarks.decode import blobs_from, decoded_by_backend; "
            f"print('decoded', decoded_by_backend('nvimgcodec', {tuple(backends)!r}, {str(device)!r}, "
            f"blobs_from(sys.argv[1], {images})))")
    env = dict(os.environ, PYNVIMGCODEC_VERBOSITY="3")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(shard_dir)], env=env, capture_output=True, text=True,
                              timeout=300, cwd=Path(__file__).resolve().parents[1])
    except (subprocess.TimeoutExpired, OSError) as err:  # the rows matter more than the log
        return f"no log: {err}"
    return telling_lines(done.stdout + done.stderr)


# nvImageCodec's lines worth keeping from a verbose log: the engines, failures, what it decoded.
TELLING = re.compile(r"(?i)hw decoder|hardware|engine|not supported|fail|trying next|error|warn|^decoded ")


def telling_lines(log: str, limit: int = 4000) -> str:
    """The lines of a verbose nvImageCodec log that say which backends it could use and why it
    passed images on (its registration and unloading lines dropped), at most `limit` characters."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in log.splitlines()]
    kept = [line for line in lines if TELLING.search(line) and "unregistering" not in line.lower()]
    return "\n".join(kept)[:limit]


def decoder_rows(name: str, shard_dir: Path, blobs: List[bytes], decoders, device, alone: dict, chunk: int,
                 model: str, compiled: bool = False, stream_priority: int = 0,
                 towers_in_process: bool = True, decode_threads: int = 1, piece: int = PIECE) -> List[dict]:
    """Two rows per decoder (alone, beside training). A one-backend set of nvImageCodec that
    leaves images to PIL is not timed (PIL's rate, not the backend's): its rows say how many it
    decoded, and the hardware backend's its log."""
    rows = []
    bytes_per_image = sum(map(len, blobs)) / len(blobs)
    for library, backend_name, backends, cpu_threads in decoders:
        decoded = decoded_by_backend(library, backends, device, blobs)
        base = {"kind": "decoder", "shards": name, "bytes_per_image": bytes_per_image, "images": len(blobs),
                "decoder": "nvjpeg", "gpu_jpeg_library": library, "backend": backend_name,
                "backends": list(backends or ()), "cpu_threads": cpu_threads, "decoded_by_backend": decoded,
                "image_size": IMAGE_SIZE, "piece": piece, "stream_priority": stream_priority,
                "decode_threads": decode_threads}
        if backend_name == "hardware":  # the engines it found, and why it passed any image on
            base["library_log"] = library_log(shard_dir, backends, device)
        if decoded is not None and decoded < len(blobs) and not backend_name.startswith("trainer's"):
            rows += [{**base, "beside_training": beside, "images_per_s": None, "host_us_per_image": None,
                      "not_timed": f"the backend decoded {decoded:,} of {len(blobs):,} images itself"}
                     for beside in (False, True)]
            print(f"{name} {library} {backend_name}: decoded {decoded:,} of {len(blobs):,} itself; not timed", flush=True)
            continue
        pieces = [piece_decoder(library, backends, device, cpu_threads, stream_priority)
                  for _ in range(decode_threads)]
        decode_all(pieces, blobs[:piece * decode_threads], piece=piece)  # untimed: handles, buffers, kernels
        by_itself = timed_decode(pieces, blobs, piece=piece)
        towers = tower_runner(model, chunk, device, compiled, towers_in_process)
        time.sleep(1.0)
        beside = timed_decode(pieces, blobs, towers.tid, piece)
        stop_towers(towers)
        beside_rate = towers.rate(beside["start"], beside["end"])
        for run, beside_training in ((by_itself, False), (beside, True)):
            n, phases = len(blobs), run["phases"]
            waiting = phases.cpu["waiting for the GPU"]  # a CUDA wait spins on a core: not work
            host_s = run["decoding_thread_s"] - waiting + run["other_threads_s"]
            row = {**base, "beside_training": beside_training, "images_per_s": n / run["seconds"],
                   "host_us_per_image": host_s / n * 1e6,
                   "decoding_thread_us_per_image": (run["decoding_thread_s"] - waiting) / n * 1e6,
                   "other_threads_us_per_image": run["other_threads_s"] / n * 1e6,
                   "waiting_cpu_us_per_image": waiting / n * 1e6,
                   "phases_us_per_image": phases.per_image_us(n)}
            if beside_training:
                row.update(towers_model=model, towers_chunk=chunk, towers_compiled=compiled,
                           towers_in="this process" if towers_in_process else "a process of their own",
                           towers_samples_per_s_alone=alone["samples_per_s"],
                           towers_samples_per_s_beside=beside_rate,
                           towers_thread_us_per_image=run["towers_thread_s"] / n * 1e6,
                           towers_slowdown=(alone["samples_per_s"] / beside_rate
                                            if beside_rate and alone["samples_per_s"] else None))
            rows.append(row)
        say(rows[-2], rows[-1])
    return rows


def say(alone_row: dict, beside_row: dict) -> None:
    slow = beside_row.get("towers_slowdown")
    print(f"{alone_row['shards']} {alone_row['gpu_jpeg_library']} {alone_row['backend']}: "
          f"{alone_row['images_per_s']:,.0f} images/s alone ({alone_row['host_us_per_image']:.0f} us host/image), "
          f"{beside_row['images_per_s']:,.0f} beside training ({beside_row['host_us_per_image']:.0f} us); "
          f"decoded by the backend itself: {alone_row['decoded_by_backend']}; towers x"
          f"{slow if slow is None else round(slow, 3)} slower", flush=True)


STEP_KEYS = ("model", "B", "world", "cores", "samples_per_s", "decode_wait_share", "decoder", "gpu_jpeg_library",
             "device", "commit", "command")


def last_set(sets, key: str, default=None):
    """The value the last `KEY=VALUE` of `sets` gives `key` (the one a recipe ends with), else `default`."""
    values = [s.split("=", 1)[1] for s in sets if s.startswith(key + "=")]
    return values[-1] if values else default


def step_rows(train_rows: List[dict], scale_rows: List[dict]) -> List[dict]:
    """Step rows: bench train's JPEG rows, each against the synthetic row of the same model,
    batch, ranks, cores, card, commit and settings (`vs_synthetic`), and the scale rows of parts that set
    a decoder (their plan's `auto:` line says what it chose). Rows of one run share their --set."""
    def run_key(r):
        return (r.get("model"), r.get("B"), r.get("world"), r.get("cores"), r.get("device"), r.get("commit"),
                tuple(r.get("set", ())))
    synthetic = {run_key(r): r for r in train_rows
                 if r.get("data") == "synthetic" and r.get("impl") == "infcl_ds" and r.get("status") == "measured"}
    out = []
    for r in train_rows:
        if r.get("data") != "jpeg" or r.get("impl") != "infcl_ds" or r.get("status") != "measured":
            continue
        base = synthetic.get(run_key(r))
        out.append({"kind": "step", **{k: r.get(k) for k in STEP_KEYS}, "decoder_resolved": r.get("decoder_resolved"),
                    "gpu_decode_lanes": int(last_set(r.get("set", ()), "data.gpu_decode_lanes", 1)),
                    "auto_line": r.get("auto_line"), "step_s": r.get("step_s"),
                    "synthetic_samples_per_s": base["samples_per_s"] if base else None,
                    "vs_synthetic": r["samples_per_s"] / base["samples_per_s"] if base else None})
    for r in scale_rows:
        sets = [*r.get("part_sets", ()), *r.get("set", ())]  # the invocation's --set after the part's own
        if "samples_per_s" not in r or last_set(sets, "data.decoder") is None:
            continue
        line = next((said for said in r.get("planner_said", ()) if said.startswith("auto:")), "")
        chosen = re.search(r"data\.decoder=(\w+)", line)
        out.append({"kind": "step", **{k: r.get(k) for k in STEP_KEYS},
                    "gpu_jpeg_library": last_set(sets, "data.gpu_jpeg_library", DEFAULT_GPU_JPEG_LIBRARY),
                    "decoder": last_set(sets, "data.decoder"),
                    "gpu_decode_lanes": int(last_set(sets, "data.gpu_decode_lanes", 1)),
                    "decoder_resolved": chosen.group(1) if chosen else None, "auto_line": line, "step_s": r["step_s"],
                    "part": r["part"], "synthetic_samples_per_s": None, "vs_synthetic": None})
    return out


def with_steps(out: Path, sources: List[Path]) -> List[dict]:
    """decode.json's decoder rows with the step rows of `sources` (bench train's and scale's
    JSON) in place of its earlier step rows."""
    kept = [r for r in json.loads(out.read_text())["rows"] if r.get("kind") != "step"] if out.is_file() else []
    train_rows, scale_rows = [], []
    for source in sources:
        rows = json.loads(Path(source).read_text())["rows"]
        (scale_rows if any("part" in r for r in rows) else train_rows).extend(rows)
    return kept + step_rows(train_rows, scale_rows)


def variant_rows(sources: List[Path]) -> List[dict]:
    """The decoder rows of each variant's file (decode_VARIANT.json, as launch/bench_decode.sh
    names them), each with its `variant`; a file named decode.json is the variants' baseline
    (`variant` "none"), measured in the same command as the variants beside it."""
    rows = []
    for source in sources:
        name = Path(source).stem
        variant = "none" if name == "decode" else name[len("decode_"):] if name.startswith("decode_") else name
        rows += [{**r, "variant": variant} for r in json.loads(Path(source).read_text())["rows"]
                 if r.get("kind") != "step"]
    return rows


def decoders_here(libraries: List[str], trainers_only: bool = False) -> List[tuple]:
    """(library, backend row name, backends, CPU threads) to measure: torchvision's binding once,
    nvImageCodec with the trainer's backends (with the library's threads and with FEW_CPU_THREADS)
    and with each backend alone (on a CPU its one CPU backend); `trainers_only`: nvImageCodec
    with the trainer's backends alone."""
    import torch
    out = []
    for library in libraries:
        if library == "torchvision":
            out.append(("torchvision", "nvjpeg" if torch.cuda.is_available() else "libjpeg-turbo", None, None))
        elif torch.cuda.is_available() and trainers_only:
            out.append(("nvimgcodec", "trainer's", NVIMGCODEC_BACKENDS["trainer's"], None))
        elif torch.cuda.is_available():
            out += [("nvimgcodec", name, kinds, None) for name, kinds in NVIMGCODEC_BACKENDS.items()]
            out.append(("nvimgcodec", f"trainer's, {FEW_CPU_THREADS} CPU threads", NVIMGCODEC_BACKENDS["trainer's"],
                        FEW_CPU_THREADS))
        else:
            out.append(("nvimgcodec", "cpu", (), None))
    return out


def main(argv=None) -> List[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", help="NAME=FOLDER[,NAME=FOLDER]: shard folders (infcl-ds data photos)")
    p.add_argument("--steps-from", help="instead of decoding: JSON files of bench train and scale rows, "
                                        "comma-separated, whose JPEG steps become the step rows of --out")
    p.add_argument("--variants-from", help="instead of decoding: decode_VARIANT.json files (and the decode.json "
                                           "measured beside them), comma-separated, gathered into --out")
    p.add_argument("--images", type=int, default=8 * PIECE, help="images decoded per row")
    p.add_argument("--trainers-backends-only", action="store_true",
                   help="nvImageCodec with the trainer's backends only (no row per backend alone)")
    p.add_argument("--piece", type=int, default=PIECE, help="images per batched decode (the lane's piece)")
    p.add_argument("--libraries", default="nvimgcodec,torchvision", help="data.gpu_jpeg_library values")
    p.add_argument("--model", default="ViT-B-16", help="the tower trained beside the decoder")
    p.add_argument("--chunk", type=int, default=256, help="the tower's samples per pass")
    p.add_argument("--seconds", type=float, default=10.0, help="the tower's timed run alone")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="seconds: sys.setswitchinterval for the run (Python's default 0.005), how long a thread "
                        "waiting for the GIL waits before the running one is asked to drop it")
    p.add_argument("--towers-compile", action="store_true",
                   help="torch.compile the tower beside the decoder, as the trainer does (its launches from Python "
                        "far fewer than the eager tower's)")
    p.add_argument("--towers-process", action="store_true",
                   help="the tower in a process of its own on the same GPU: the decoder beside training without "
                        "sharing an interpreter lock with it (the trainer shares one)")
    p.add_argument("--decode-threads", type=int, default=1,
                   help="piece decoders side by side, each on a thread and a stream of its own with every N-th "
                        "piece: whether calls that wait on the GPU overlap")
    p.add_argument("--blocking-sync", action="store_true",
                   help="CUDA waits sleep rather than spin (CU_CTX_SCHED_BLOCKING_SYNC): a library call's own "
                        "waits then leave the host figure")
    p.add_argument("--stream-priority", choices=("normal", "high"), default="normal",
                   help="the decoding stream's CUDA priority: high puts its kernels ahead of the towers'")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.decode_threads < 1:
        p.error(f"--decode-threads takes 1 or more, got {args.decode_threads}")
    if args.blocking_sync:
        blocking_sync()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if args.variants_from:
        rows = variant_rows([Path(f) for f in args.variants_from.split(",")])
        first = json.loads(Path(args.variants_from.split(",")[0]).read_text())["meta"]
        # the rows' device, not this machine's; each row says its commit and command
        meta = {k: v for k, v in first.items() if k not in ("command", "commit")}
        write_rows(args.out, rows, {**meta, "commits": sorted({r.get("commit") for r in rows if r.get("commit")}),
                                    "sources": [Path(f).name for f in args.variants_from.split(",")]})
        from .plot_data import plot_decode_variants
        plot_decode_variants(args.out, args.out.with_suffix(".png"))
        return rows
    if args.steps_from:
        rows = with_steps(args.out, [Path(f) for f in args.steps_from.split(",")])
        meta = json.loads(args.out.read_text())["meta"] if args.out.is_file() else run_identity()
        write_rows(args.out, rows, meta)
        for row in (r for r in rows if r.get("kind") == "step"):
            vs = row["vs_synthetic"]
            print(f"{row['model']} B={row['B']:,} on {row['world']} GPU(s), {row['cores']} cores: "
                  f"{row['samples_per_s']:,.0f} samples/s, {'' if vs is None else f'{vs:.3f}x synthetic, '}"
                  f"decode wait {row['decode_wait_share']:.1%}, decoder {row['decoder']} -> {row['decoder_resolved']}",
                  flush=True)
        from .plot_data import plot_decode
        plot_decode(args.out, args.out.with_suffix(".png"))
        return rows
    if not args.shards:
        p.error("--shards is needed (or --steps-from)")

    import torch
    # an index: the tower's thread sets it as its current device
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if any("=" not in item for item in args.shards.split(",")):
        p.error(f"--shards takes NAME=FOLDER[,NAME=FOLDER], got {args.shards!r}")
    folders: Dict[str, Path] = dict((name, Path(folder)) for name, folder in
                                    (item.split("=", 1) for item in args.shards.split(",")))
    decoders = decoders_here(args.libraries.split(","), args.trainers_backends_only)
    compiled = args.towers_compile
    priority = -1 if args.stream_priority == "high" else 0  # CUDA: lower numbers are higher priorities
    alone = towers_alone(args.model, args.chunk, device, args.seconds, compiled, not args.towers_process)
    cores = "in a process of their own" if alone["cpu_per_s"] is None else f"{alone['cpu_per_s']:.2f} cores"
    print(f"towers alone: {alone['samples_per_s']:,.1f} samples/s, {cores}", flush=True)
    identity = {**run_identity(), "cpus": os.cpu_count(), "cores": len(os.sched_getaffinity(0)),
                "switch_interval_s": sys.getswitchinterval(), "cuda_waits": "sleep" if args.blocking_sync else "spin",
                "command": "python -m benchmarks.decode " +
                " ".join(argv if argv is not None else sys.argv[1:])}
    # the step rows already in --out stay (`--steps-from` made them)
    steps = [r for r in json.loads(args.out.read_text())["rows"] if r.get("kind") == "step"] if args.out.is_file() else []
    rows = []
    for name, folder in folders.items():
        blobs = blobs_from(folder, args.images)
        rows += [{**row, **identity} for row in
                 decoder_rows(name, folder, blobs, decoders, device, alone, args.chunk, args.model,
                              compiled, priority, not args.towers_process, args.decode_threads, args.piece)]
        write_rows(args.out, rows + steps, identity)  # after each folder: a call cut short keeps it
    from .plot_data import plot_decode
    plot_decode(args.out, args.out.with_suffix(".png"))
    return rows


if __name__ == "__main__":
    main()
