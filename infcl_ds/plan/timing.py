"""Step time from measured kernel rates, an assumed encoder rate and stated link bandwidths.

Loss: the effective work of the bidirectional loss is 8 B^2 D FLOPs (docs/benchmarks.md:
forward 2 B^2 D, backward 6 B^2 D), split evenly over W GPUs by the ring, each running W
blocks of b x b (b = B / W) at the rate ``infcl-ds bench loss`` measured for the nearest D
and block size (docs/benchmarks/loss.json, one H200). Per hop a rank computes one block while
the next one travels: forward the text block (features' dtype) and its column statistics,
backward the block again, its statistics and an fp32 partial gradient. A hop takes the
longer of the two; all ranks move in step, so the slowest link in the ring sets it (the
one hop between nodes once the ring leaves a node). Per-message latency is not modelled.

Encoders: 4 forward passes' FLOPs per sample (the no-grad forward, the forward again with
grad, a backward of twice the forward), 5 with activation checkpointing (one more forward
in the backward), at an assumed sustained rate.
"""
import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .encoders import ModelEstimate
from .errors import PlanError
from .memory import DTYPE_BYTES

MEASURED_RATES = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "loss.json"

# Sustained encoder rate, bf16, H100/H200 class: about 40% of the 989 TFLOP/s dense peak,
# what OpenCLIP ViT training typically reaches (35-50% MFU). fp32 models run TF32 at half.
DEFAULT_ENCODER_TFLOPS = 400.0
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
    def load(cls, path=MEASURED_RATES) -> "KernelRates":
        path = Path(path)
        if not path.is_file():
            raise PlanError(f"plan: measured kernel rates not found at {path} (write them with "
                            "`infcl-ds bench loss --out FILE` and pass --rates FILE)")
        data = json.loads(path.read_text())
        rows = tuple((r["dtype"], r["D"], r["B"], r["tflops_eff"] * 1e12) for r in data["rows"]
                     if r.get("impl") == "infcl_ds" and r.get("status") == "measured" and r.get("tflops_eff"))
        if not rows:
            raise PlanError(f"plan: {path} has no measured infcl_ds rows")
        phases = data.get("meta", {}).get("phases")
        fraction = phases["forward_ms"] / phases["total_ms"] if phases else 0.25  # 2 of 8 B^2 D
        device = data.get("meta", {}).get("device", "?")
        return cls(rows=rows, forward_fraction=fraction, source=f"{path.name} ({device})")

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


def hop_bytes(block: int, dim: int, elem: int) -> tuple:
    """(forward, backward) bytes one rank sends per hop: the text block and its fp32 column
    statistics; in the backward also the fp32 partial text gradient."""
    forward = block * dim * elem + 4 * block
    return forward, forward + 4 * block * dim


def ring_link(world: int, gpus_per_node: int, network: str) -> tuple:
    """(name, bytes/s) of the slowest link a hop crosses."""
    if world <= gpus_per_node:
        return "NVLink", NVLINK
    return network, NETWORKS[network]


def ring_hop(block: int, dim: int, elem: int, rate: float, forward_fraction: float, link: str,
             bandwidth: float) -> RingHop:
    work = 8 * block * block * dim / rate
    fwd_bytes, bwd_bytes = hop_bytes(block, dim, elem)
    return RingHop(compute_fwd=work * forward_fraction, compute_bwd=work * (1 - forward_fraction),
                   comm_fwd=fwd_bytes / bandwidth, comm_bwd=bwd_bytes / bandwidth, link=link)


@dataclass(frozen=True)
class StepTime:
    encoders: float       # seconds
    loss: float
    hop: Optional[RingHop]
    rate: Rate
    encoder_flops: float  # per sample, all passes
    encoder_rate: float
    hiding_block: Optional[int] = None  # the smallest local batch whose hops hide their transfers

    @property
    def total(self) -> float:
        return self.encoders + self.loss


def encoder_passes(checkpointing: bool) -> int:
    return 5 if checkpointing else 4


def step_time(model: ModelEstimate, local: int, world: int, dtype: str, checkpointing: bool, rates: KernelRates,
              gpus_per_node: int, network: str = DEFAULT_NETWORK,
              encoder_tflops: float = DEFAULT_ENCODER_TFLOPS) -> StepTime:
    elem = DTYPE_BYTES[dtype]
    rate = rates.rate(local, model.embed_dim, dtype)
    encoder_rate = encoder_tflops * 1e12 / (FP32_ENCODER_SLOWDOWN if dtype == "fp32" else 1.0)
    per_sample = encoder_passes(checkpointing) * model.forward_flops()
    if world == 1:
        hop, loss, hiding = None, 8 * local * local * model.embed_dim / rate.flops, None
    else:
        link, bandwidth = ring_link(world, gpus_per_node, network)
        hop = ring_hop(local, model.embed_dim, elem, rate.flops, rates.forward_fraction, link, bandwidth)
        loss = world * hop.time
        hiding = min_hidden_block(model.embed_dim, elem, rate.flops, rates.forward_fraction, bandwidth)
    return StepTime(encoders=per_sample * local / encoder_rate, loss=loss, hop=hop, rate=rate,
                    encoder_flops=per_sample, encoder_rate=encoder_rate, hiding_block=hiding)


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
    b^2, transfer as b)."""
    fwd = (dim * elem + 4) * rate / (forward_fraction * 8 * dim * bandwidth)
    bwd = (dim * (elem + 4) + 4) * rate / ((1 - forward_fraction) * 8 * dim * bandwidth)
    return math.ceil(max(fwd, bwd))
