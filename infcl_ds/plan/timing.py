"""Step time from measured kernel and encoder rates and stated link bandwidths.

A step is what the engine does (infcl_ds/engine/step.py), phase by phase:

encode     every chunk through both towers once, without grad;
loss       the ring over the cached features;
re-encode  every chunk again with grad, forward and backward (with activation
           checkpointing the backward recomputes each layer's forward once more);
optimizer  one step on the rank's partition: measured at 0.03-0.04 s for ViT-B-16 on 2 GPUs
           (docs/benchmarks/train.json), under 0.2% of those steps; not modelled.

Encoders: the seconds per sample per GPU measured for the model (MEASURED_ENCODER_RATES), else
the passes' FLOPs (encoder_passes) at an effective rate per GPU (DEFAULT_ENCODER_TFLOPS or
--encoder-tflops).

Loss: the effective work of the bidirectional loss is 8 B^2 D FLOPs (docs/benchmarks.md:
forward 2 B^2 D, backward 6 B^2 D), split evenly over W GPUs by the ring, each running W
blocks of b x b (b = B / W) at the rate ``infcl-ds bench loss`` measured for the nearest D
and block size (infcl_ds/calibration/loss_rates.json: the infcl_ds rows of
docs/benchmarks/loss.json, one H200). Per hop a rank computes one block while
the next one travels: forward the text block (features' dtype) and its column statistics,
backward the block again, its statistics and an fp32 partial gradient. A hop takes the
longer of the two; all ranks move in step, so the slowest link in the ring sets it (the
one hop between nodes once the ring leaves a node). Per-message latency is not modelled.

Inputs, with encoded host batches: a local batch is decoded once per engine pass, twice per step
(less the chunks kept decoded on the GPU between the passes, data.keep_decoded_gib), by the
rank's decode processes and/or its GPU decoder, each ahead of the engine within its window; how
long the engine waits for them in a steady step is plan/overlap.py's model (`decoding`).
"""
import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..config import Recipe
from ..data.decoding.decode_pool import DECODE_PIECE_ROWS, window_slots
from ..data.footprint import (DECODE_RATES_PER_WORKER, device_window_rows, gpu_decode_rate, gpu_decode_share,
                              gpu_decode_towers_slowdown, has_pool, host_kept_rows, pool_window_rows)
from ..engine.step import engine_passes
from ..engine.tower_footprint import ModelEstimate
from ..parallel.ring_bytes import hop_bytes
from ..resources import read_json
from .memory import DTYPE_BYTES
from .overlap import Decoder, Overlap, StepShape, overlap, tolerance_s
from .refusal import PlanError


@dataclass(frozen=True)
class EncoderRate:
    """The encode and re-encode phases of one measured engine step, per GPU."""
    samples: int             # local batch of the measured step
    encode_s: float          # no-grad forward of all its chunks
    reencode_s: float        # forward with grad + backward of all its chunks
    source: str
    chunk: int = 0           # the chunk it was measured at (0: not recorded)

    @property
    def forward(self) -> float:  # seconds per sample of the no-grad forward
        return self.encode_s / self.samples

    @property
    def forward_backward(self) -> float:  # seconds per sample of the forward with grad and the backward
        return self.reencode_s / self.samples


# Measured encoder rates by open_clip model name: calibration/encoder_rates.json, refitted by
# `python -m infcl_ds.plan.calibrate --write` (docs/planner.md).
_ENCODER_RATES = read_json("calibration", "encoder_rates.json")["models"]
MEASURED_ENCODER_RATES: Dict[str, EncoderRate] = {
    name: EncoderRate(**{k: v for k, v in entry.items() if k != "compiled"}) for name, entry in _ENCODER_RATES.items()}
# The same phases with compiled towers (model.compile). A model without a compiled measurement
# is planned at its eager rate (compilation does not make it slower there).
COMPILED_ENCODER_RATES: Dict[str, EncoderRate] = {
    name: EncoderRate(**entry["compiled"]) for name, entry in _ENCODER_RATES.items() if "compiled" in entry}
# Measured, with their sources: calibration/overheads.json.
_OVERHEADS = read_json("calibration", "overheads.json")
# ZeRO-3's eager encoder time over ZeRO-2's eager (its per-module hooks). Across GPUs its
# parameter gathers are communication as well: a floor. ZeRO-3 does not compile the towers
# (config/recipe.py's compile_supported).
ZERO3_ENCODER_SLOWDOWN = float(_OVERHEADS["zero3_encoder_slowdown"])
# ZeRO-3's hooks run on the host around every module of every chunk pass. Large chunks give the
# GPU enough work to hide them (above); small ones do not: the seconds per no-grad and per grad
# chunk pass measured for ViT-B-16 are a floor that does not depend on the model's FLOPs,
# transferred to other models (the hooks' cost grows with the module count: not measured for others).
ZERO3_CHUNK_FLOOR_S = tuple(float(s) for s in _OVERHEADS["zero3_chunk_floor_s"])
# model.float8's encode and re-encode phases over the bf16 towers' (measured on ViT-L-14's
# compiled towers only, without checkpointing; applied to every float8 recipe): float8 makes the
# no-grad pass a little faster and the grad pass slower (its casts for the backward's GEMMs cost
# more than the float8 GEMMs save at these widths).
FLOAT8_PHASE_FACTORS = tuple(float(f) for f in _OVERHEADS["float8_phase_factors"])
# A chunk half as large makes the encoder phases this much slower (the GPU less full, more
# launches); measured on ViT-B-16 (eager, one H200) between chunks 256 and 1,024.
CHUNK_HALVING_SLOWDOWN = float(_OVERHEADS["chunk_halving_slowdown"])
# The largest chunk a gain was measured up to: larger chunks are planned at its rate.
CHUNK_GAIN_MEASURED_UP_TO = 1024


def chunk_factor(chunk, measured: int) -> float:
    """The encoder phases at `chunk` over those at the `measured` chunk (CHUNK_HALVING_SLOWDOWN a
    halving; no gain planned beyond CHUNK_GAIN_MEASURED_UP_TO). 1 where either is unknown."""
    if not isinstance(chunk, int) or not measured:
        return 1.0
    planned = min(chunk, max(measured, CHUNK_GAIN_MEASURED_UP_TO))
    return CHUNK_HALVING_SLOWDOWN ** math.log2(measured / planned)


# Models not measured: ViT-B-16's measured effective rate per GPU, transferred.
DEFAULT_ENCODER_TFLOPS = float(_OVERHEADS["default_encoder_tflops"])
# fp32 models (TF32 matrix products): half the bf16 rate, a guess, not measured.
FP32_ENCODER_SLOWDOWN = 2.0
# Bytes per second one way. NVLink 4 (H100/H200 SXM) is 900 GB/s counting both directions; a
# ring hop sends one way. Between nodes a hop uses one 200 or 400 Gb/s NIC.
NVLINK = 450e9
NETWORKS = {"200 Gb/s": 25e9, "400 Gb/s": 50e9}
DEFAULT_NETWORK = "400 Gb/s"


@dataclass(frozen=True)
class KernelRates:
    """Effective loss rates (8 B^2 D / time) measured on one GPU, and the forward's share of
    the time (from the benchmark's phase split)."""
    rows: tuple           # (dtype, D, B, FLOP/s)
    forward_fraction: float
    source: str

    @classmethod
    def load(cls, path=None) -> "KernelRates":
        """The shipped rates (calibration/loss_rates.json), or those of a benchmark file
        written by `infcl-ds bench loss --out FILE` (--rates FILE)."""
        if path is None:
            data = read_json("calibration", "loss_rates.json")
        else:
            path = Path(path)
            if not path.is_file():
                raise PlanError(f"plan: measured kernel rates not found at {path} (write them with "
                                "`infcl-ds bench loss --out FILE` and pass --rates FILE)")
            data = loss_rates_calibration(json.loads(path.read_text()), path.name)
        rows = tuple((r["dtype"], r["D"], r["B"], r["tflops_eff"] * 1e12) for r in data["rows"])
        return cls(rows=rows, forward_fraction=data["forward_fraction"], source=data["source"])

    def rate(self, block: int, dim: int, dtype: str) -> "Rate":
        """The rate for ``dtype`` (bf16 if it was not measured) at the nearest measured D,
        interpolated in log B between the measured batches around the block size; outside
        them, the nearest one's (optimistic below the smallest: small blocks fill the GPU less)."""
        rows = [r for r in self.rows if r[0] == dtype] or [r for r in self.rows if r[0] == "bf16"]
        nearest_d = min({r[1] for r in rows}, key=lambda d: abs(d - dim))
        points = sorted((r[2], r[3]) for r in rows if r[1] == nearest_d)
        batches = [b for b, _ in points]
        i = bisect.bisect_left(batches, block)
        if i == 0 or i == len(points):
            flops = points[min(i, len(points) - 1)][1]
        else:
            (b0, f0), (b1, f1) = points[i - 1], points[i]
            t = math.log(block / b0) / math.log(b1 / b0)
            flops = f0 + t * (f1 - f0)
        return Rate(flops, rows[0][0], nearest_d, block)


def loss_rates_calibration(benchmark: dict, name: str) -> dict:
    """calibration/loss_rates.json from the JSON of `infcl-ds bench loss`: its measured infcl_ds
    rows, and the forward's share of the time from its phase split (else 2 of 8 B^2 D)."""
    # The CLIP loss's rows only: a sigmoid loss file's rates count 6 B^2 D (files written
    # before rows said so are the CLIP loss's).
    rows = [{key: r[key] for key in ("dtype", "D", "B", "tflops_eff")} for r in benchmark["rows"]
            if r.get("impl") == "infcl_ds" and r.get("status") == "measured" and r.get("tflops_eff")
            and r.get("flops_per_B2D", 8) == 8]
    if not rows:
        raise PlanError(f"plan: {name} has no measured infcl_ds rows of the CLIP loss (`infcl-ds bench loss`)")
    meta = benchmark.get("meta", {})
    phases = meta.get("phases")
    fraction = phases["forward_ms"] / phases["total_ms"] if phases else 0.25
    return {"source": f"{name} ({meta.get('device', '?')})", "forward_fraction": fraction, "rows": rows}


@dataclass(frozen=True)
class Rate:
    """A kernel rate (effective FLOP/s) for a block of ``batch`` rows at width ``dim``."""
    flops: float
    dtype: str
    dim: int
    batch: int


@dataclass(frozen=True)
class RingHop:
    """One hop of the ring: a block's compute against its transfer, forward and backward."""
    compute_fwd: float
    compute_bwd: float
    comm_fwd: float
    comm_bwd: float
    link: str

    @property
    def compute(self) -> float:
        return self.compute_fwd + self.compute_bwd

    @property
    def comm(self) -> float:
        return self.comm_fwd + self.comm_bwd

    @property
    def time(self) -> float:
        return max(self.compute_fwd, self.comm_fwd) + max(self.compute_bwd, self.comm_bwd)

    @property
    def hidden(self) -> bool:
        return self.comm_fwd <= self.compute_fwd and self.comm_bwd <= self.compute_bwd


def ring_hop(block: int, dim: int, elem: int, rate: float, forward_fraction: float, link: str,
             bandwidth: float) -> RingHop:
    work = 8 * block * block * dim / rate
    fwd_bytes, bwd_bytes = hop_bytes(block, dim, elem)
    return RingHop(compute_fwd=work * forward_fraction, compute_bwd=work * (1 - forward_fraction),
                   comm_fwd=fwd_bytes / bandwidth, comm_bwd=bwd_bytes / bandwidth, link=link)


@dataclass(frozen=True)
class StepTime:
    encode: float         # seconds: the no-grad forward of the local batch
    reencode: float       # seconds: its forward with grad and backward
    loss: float
    hop: Optional[RingHop]
    rate: Rate
    encoder_flops: float  # per sample, all passes
    encoder_rate: float   # effective FLOP/s per GPU of the encoders (measured or assumed)
    encoder_source: str   # where the encoder rate comes from
    encoder_measured: bool = False
    hiding_block: Optional[int] = None  # the smallest local batch whose hops hide their transfers

    @property
    def encoders(self) -> float:
        return self.encode + self.reencode

    @property
    def total(self) -> float:
        return self.encoders + self.loss


def encoder_passes(checkpointing: bool) -> int:
    """Forward-pass equivalents per sample: the no-grad forward, the forward with grad, a
    backward of twice the forward, and with checkpointing the recomputed forward."""
    return 5 if checkpointing else 4


def encoder_times(model: ModelEstimate, local: int, dtype: str, checkpointing: bool,
                  encoder_tflops: Optional[float] = None, compiled: bool = False, chunk=None) -> tuple:
    """(encode s, re-encode s, effective FLOP/s, source, measured) for ``local`` samples per GPU
    in chunks of ``chunk``. ``encoder_tflops`` None: the model's measured rates (with `compiled`,
    the compiled towers' where measured) if any, at ``chunk`` (chunk_factor), else
    DEFAULT_ENCODER_TFLOPS; a number: that rate for every model."""
    slowdown = FP32_ENCODER_SLOWDOWN if dtype == "fp32" else 1.0
    flops = model.forward_flops()
    measured = None
    if encoder_tflops is None:
        measured = (compiled and COMPILED_ENCODER_RATES.get(model.name)) or MEASURED_ENCODER_RATES.get(model.name)
    if measured is not None:
        at_chunk = chunk_factor(chunk, measured.chunk)
        encode = local * measured.forward * slowdown * at_chunk
        # The recomputed forward in the backward counted as one more no-grad forward.
        reencode = local * (measured.forward_backward + (measured.forward if checkpointing else 0.0)) * slowdown * at_chunk
        source = f"measured ({measured.source})" + (", x2 for fp32 (a guess)" if slowdown > 1 else "")
        if at_chunk != 1.0:
            source += f"; x{at_chunk:.3f} at chunk {chunk} (x{CHUNK_HALVING_SLOWDOWN} a halving of the chunk)"
        if compiled and model.name not in COMPILED_ENCODER_RATES:
            source += "; eager towers' rate (compiled ones not measured for this model)"
        rate = encoder_passes(checkpointing) * flops * local / (encode + reencode)
        return encode, reencode, rate, source, True
    if encoder_tflops is None:
        encoder_tflops = DEFAULT_ENCODER_TFLOPS
        source = f"ViT-B-16's measured rate, not measured for {model.name}"
    else:
        source = "assumed (--encoder-tflops)"
    rate = encoder_tflops * 1e12 / slowdown
    backward_passes = encoder_passes(checkpointing) - 1
    return flops * local / rate, backward_passes * flops * local / rate, rate, source, False


def beside_gpu_decoder(data, local: int, encode: float, reencode: float, source: str) -> tuple:
    """(encode, re-encode, source) with the towers slowed where the GPU decoder shares their GPU:
    by its measured slowdown (gpu_decode_towers_slowdown) over the share of the towers' time it
    is busy decoding its rows once (at least: rows not kept between the passes decode twice)."""
    share = gpu_decode_share(data)
    slowdown = gpu_decode_towers_slowdown(data.gpu_jpeg_library, data.gpu_decode_lanes) if share > 0 else 1.0
    if slowdown == 1.0 or encode + reencode <= 0:
        return encode, reencode, source
    busy = min(1.0, share * local / gpu_decode_rate(data.gpu_jpeg_library, data.gpu_decode_lanes) / (encode + reencode))
    factor = 1 + (slowdown - 1) * busy
    return (encode * factor, reencode * factor,
            source + f"; x{factor:.3f} beside the GPU decoder (x{slowdown} while it decodes, {busy:.0%} of the time)")


def step_time(model: ModelEstimate, recipe: Recipe, world: int, rates: KernelRates, gpus_per_node: int,
              network: str = DEFAULT_NETWORK, encoder_tflops: Optional[float] = None) -> StepTime:
    """The step's phases on each GPU (``encoder_tflops``: as encoder_times, with the compiled
    towers' rates where the recipe compiles). ZeRO-3 multiplies the encoder phases by
    ZERO3_ENCODER_SLOWDOWN and takes at least ZERO3_CHUNK_FLOOR_S per chunk pass."""
    local, dtype, checkpointing = recipe.local_batch(world), recipe.precision.dtype, recipe.model.grad_checkpointing
    elem = DTYPE_BYTES[dtype]
    rate = rates.rate(local, model.embed_dim, dtype)
    encode, reencode, encoder_rate, source, measured = encoder_times(model, local, dtype, checkpointing,
                                                                     encoder_tflops, recipe.compiles("cuda"),
                                                                     recipe.batch.chunk)
    if recipe.model.float8:
        bf16 = encode + reencode
        encode, reencode = encode * FLOAT8_PHASE_FACTORS[0], reencode * FLOAT8_PHASE_FACTORS[1]
        encoder_rate *= bf16 / (encode + reencode)
        source += (f"; model.float8: x{FLOAT8_PHASE_FACTORS[0]} encode, x{FLOAT8_PHASE_FACTORS[1]} re-encode "
                   f"(ViT-L-14's compiled towers' float8 over bf16, one H100)")
    if recipe.zero.stage >= 3:
        passes = math.ceil(local / recipe.batch.chunk)
        zero2 = encode + reencode
        encode = max(encode * ZERO3_ENCODER_SLOWDOWN, passes * ZERO3_CHUNK_FLOOR_S[0])
        reencode = max(reencode * ZERO3_ENCODER_SLOWDOWN, passes * ZERO3_CHUNK_FLOOR_S[1])
        encoder_rate *= zero2 / (encode + reencode)
        source += (f"; ZeRO-3's per-module hooks: x{ZERO3_ENCODER_SLOWDOWN}, at least {ZERO3_CHUNK_FLOOR_S[0]} + "
                   f"{ZERO3_CHUNK_FLOOR_S[1]} s per chunk (measured on one GPU)")
    before = encode + reencode
    encode, reencode, source = beside_gpu_decoder(recipe.data, local, encode, reencode, source)
    encoder_rate *= before / (encode + reencode) if encode + reencode > 0 else 1.0
    if world == 1:
        hop, loss, hiding = None, 8 * local * local * model.embed_dim / rate.flops, None
    else:
        # the slowest link a hop crosses
        link, bandwidth = ("NVLink", NVLINK) if world <= gpus_per_node else (network, NETWORKS[network])
        hop = ring_hop(local, model.embed_dim, elem, rate.flops, rates.forward_fraction, link, bandwidth)
        loss = world * hop.time
        hiding = min_hidden_block(model.embed_dim, elem, rate.flops, rates.forward_fraction, bandwidth)
    return StepTime(encode=encode, reencode=reencode, loss=loss, hop=hop, rate=rate,
                    encoder_flops=encoder_passes(checkpointing) * model.forward_flops(), encoder_rate=encoder_rate,
                    encoder_source=source, encoder_measured=measured, hiding_block=hiding)


@dataclass(frozen=True)
class ScalingRow:
    global_batch: int
    ranks: int
    local: int
    rate: Rate
    hops: Dict[str, RingHop]   # per inter-node link (NVLink inside one node)

    def loss_time(self, link: str) -> float:
        return self.ranks * self.hops[link].time


def ring_scaling_table(global_batches: Sequence[int] = (1 << 22, 12 * (1 << 20)), dim: int = 768,
                       ranks: Sequence[int] = tuple(8 << k for k in range(8)), gpus_per_node: int = 8,
                       dtype: str = "bf16", rates: Optional[KernelRates] = None) -> List[ScalingRow]:
    """The ring's loss time at fixed global batches as ranks grow, for each inter-node network
    (8 ranks: one node, NVLink)."""
    rates = rates or KernelRates.load()
    rows = []
    for batch in global_batches:
        for world in ranks:
            local = batch // world
            rate = rates.rate(local, dim, dtype)
            links = ({"NVLink": NVLINK} if world <= gpus_per_node else NETWORKS)
            hops = {name: ring_hop(local, dim, DTYPE_BYTES[dtype], rate.flops, rates.forward_fraction, name, bw)
                    for name, bw in links.items()}
            rows.append(ScalingRow(batch, world, local, rate, hops))
    return rows


def min_hidden_block(dim: int, elem: int, rate: float, forward_fraction: float, bandwidth: float) -> int:
    """The smallest block whose compute hides its transfer in both passes (compute grows as
    b^2, transfer as b: hop_bytes of one row)."""
    fwd, bwd = hop_bytes(1, dim, elem)
    return math.ceil(max(fwd * rate / (forward_fraction * 8 * dim * bandwidth),
                         bwd * rate / ((1 - forward_fraction) * 8 * dim * bandwidth)))


@dataclass(frozen=True)
class Decoding:
    """A rank's decoding against its steady step (encoded host batches): the overlap model's
    result, and the rates it was made with."""
    overlap: Overlap
    workers: int        # decode processes (0: the training process decodes, or only the GPU)
    per_worker: float   # decodes per second of one process with the recipe's data.decoder
    device_rate: float  # decodes per second of the GPU's decoder (nvjpeg, hybrid); 0 without
    window_rows: int    # the decode processes' window (0 without processes)

    @property
    def decodes(self) -> int:
        """Rows decoded per step: every row in the first pass, again in the second unless kept."""
        return self.overlap.shape.decodes

    @property
    def needed(self) -> float:
        """Decodes per second that would keep up with the step's compute."""
        compute = self.overlap.shape.compute_s
        return self.decodes / compute if compute > 0 else 0.0

    @property
    def available(self) -> float:
        return sum(d.rate for d in self.overlap.decoders)

    @property
    def wait_s(self) -> float:
        return self.overlap.wait_s

    @property
    def binds(self) -> bool:
        """The engine waits for decoded rows in a steady step."""
        return self.overlap.wait_s > tolerance_s(self.overlap.shape)

    def workers_needed(self) -> int:
        """Decode processes that would deliver the step's decodes in its compute, beside the GPU's."""
        return int(-(-max(0.0, self.needed - self.device_rate) // self.per_worker))


def step_shape(recipe: Recipe, local: int, time: "StepTime", kept: int, image_size: int) -> StepShape:
    """The step as the overlap model sees it: the local batch in chunks, the rows kept on the GPU
    and in the decode pool's window, the engine's passes (engine.step.engine_passes) and the
    planned phases."""
    chunk = recipe.batch.chunk
    chunks = -(-local // chunk)
    passes = engine_passes(chunks, recipe.zero.stage, recipe.batch.offload_features)
    on_host = host_kept_rows(recipe.data, local, image_size, chunk, kept) if passes == 2 else 0
    return StepShape(local=local, chunk=chunk, kept=kept, passes=passes, encode_s=time.encode, loss_s=time.loss,
                     reencode_s=time.reencode, host_kept=on_host)


def rate_per_process(data) -> float:
    """Decodes per second of one decode process with the recipe's decoder (PIL's beside the GPU's)."""
    return DECODE_RATES_PER_WORKER["pil" if data.decoder in ("nvjpeg", "hybrid") else data.decoder]


def step_decoders(recipe: Recipe, local: int, image_size: int, host_kept: int = 0) -> list:
    """The rank's decoders for the overlap model, in ChunkDecoder.split's order: the decode
    processes (the training process where there are none) with the window they decode into (its
    slots hold the `host_kept` rows kept between the passes too), then the GPU decoder's lane
    with its own."""
    data = recipe.data
    share = gpu_decode_share(data)
    per_worker = rate_per_process(data)
    decoders = []
    if share < 1 or host_kept:  # the processes decode the chunks their window keeps alone
        if has_pool(data):
            rows = pool_window_rows(data, local, image_size) + host_kept
            rows = window_slots(rows, data.decode_workers) * DECODE_PIECE_ROWS
            decoders.append(Decoder(data.decode_workers * per_worker, rows, 1 - share))
        else:  # the training process decodes a chunk when the engine asks for it: nothing ahead
            decoders.append(Decoder(per_worker, 0, 1 - share))
    if share > 0:
        decoders.append(Decoder(gpu_decode_rate(data.gpu_jpeg_library, data.gpu_decode_lanes),
                                device_window_rows(data, local, image_size), share))
    return decoders


def decoding(recipe: Recipe, local: int, time: "StepTime", kept: int, image_size: int) -> Decoding:
    """The recipe's decoding (every `auto` of its data section resolved) against its planned
    step, `kept` rows of the local batch kept decoded on the GPU between the passes."""
    data = recipe.data
    shape = step_shape(recipe, local, time, kept, image_size)
    decoders = step_decoders(recipe, local, image_size, shape.host_kept)
    share = gpu_decode_share(data)
    pool = has_pool(data) and (share < 1 or shape.host_kept > 0)
    return Decoding(overlap=overlap(shape, decoders), workers=data.decode_workers if pool else 0,
                    per_worker=rate_per_process(data),
                    device_rate=gpu_decode_rate(data.gpu_jpeg_library, data.gpu_decode_lanes) if share > 0 else 0.0,
                    window_rows=decoders[0].window if pool else 0)
