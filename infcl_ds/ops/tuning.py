"""Tile shapes: a fixed shape under the Triton interpreter, a measured choice on GPUs.

`triton.autotune` re-tunes on every new key and runs the full problem per candidate; at a
batch of a million one forward takes seconds, so that would cost minutes. Instead each
kernel is timed once per (kernel, D, dtype, precision, device) on a representative slice
(`TUNE_ROWS` rows) and the winner is cached for the process. Set
``INFCL_DS_TILE=BMxBNxBKxWARPSxSTAGES`` (e.g. ``128x128x64x8x3``) to pin a shape.
"""
import dataclasses
import os
from typing import Callable, Dict, Iterable, Tuple

import torch
import triton


@dataclasses.dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 1

    @classmethod
    def parse(cls, text: str) -> "TileConfig":
        try:
            bm, bn, bk, w, s = (int(x) for x in text.lower().split("x"))
        except ValueError as err:
            raise ValueError(f"INFCL_DS_TILE={text!r}: expected BMxBNxBKxWARPSxSTAGES, e.g. 128x128x64x8x3") from err
        return cls(bm, bn, bk, w, s)


# Hopper-oriented candidates (wgmma wants BLOCK_M a multiple of 64 per warpgroup);
# all of them are also valid on Ampere/Ada, where the tuner simply picks another winner.
GPU_CANDIDATES: Tuple[TileConfig, ...] = (
    TileConfig(128, 128, 64, 8, 3),
    TileConfig(128, 128, 64, 4, 4),
    TileConfig(128, 256, 64, 8, 3),
    TileConfig(256, 128, 64, 8, 3),
    TileConfig(128, 128, 128, 8, 3),
    TileConfig(128, 64, 64, 4, 4),
    # fp32 operands take twice the shared memory per K step
    TileConfig(128, 128, 32, 8, 3),
    TileConfig(128, 128, 32, 4, 4),
    TileConfig(128, 256, 32, 8, 3),
)
TUNE_ROWS = 16384
# Below this many rows a problem takes small_problem_config's tiles untimed: such a kernel runs
# for microseconds, so no tile can save more than that per call, while timing nine candidates
# (each compiled first) costs seconds per problem class; the GPU test suite (`bash tests/run.sh
# --gpu`), whose awkward sizes are all this small, would otherwise tune for minutes.
SMALL_ROWS = 1024

_cache: Dict[tuple, TileConfig] = {}


def interpreting() -> bool:
    """True when Triton kernels run on CPU tensors through TRITON_INTERPRET=1."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreter_config(D: int) -> TileConfig:
    # Every interpreted tile step costs milliseconds, so take large tiles and few steps.
    bk = min(128, triton.next_power_of_2(max(D, 16)))
    return TileConfig(64, 64, bk, 4, 1)


def small_problem_config(D: int) -> TileConfig:
    # 2 stages of 64x64 fp32 tiles: 64 KiB of shared memory, within every GPU Triton supports.
    return TileConfig(64, 64, min(64, triton.next_power_of_2(max(D, 16))), 4, 2)


def pick_config(kind: str, D: int, dtype: torch.dtype, precision: str, device: torch.device,
                time_config: Callable[[TileConfig], float], rows: int,
                candidates: Iterable[TileConfig] = GPU_CANDIDATES) -> TileConfig:
    """Return the fastest candidate for this kernel and problem class (cached); fixed tiles for
    problems under SMALL_ROWS rows.

    rows: the problem's row count; problems smaller than TUNE_ROWS are their own class
    (a shape tuned on a small batch would starve the GPU on a large one)."""
    pinned = os.environ.get("INFCL_DS_TILE")
    if pinned:
        return TileConfig.parse(pinned)
    if interpreting() or device.type != "cuda":
        return interpreter_config(D)
    if rows < SMALL_ROWS:
        return small_problem_config(D)
    key = (kind, D, dtype, precision, device.index, min(rows, TUNE_ROWS))
    if key not in _cache:
        timings = {}
        for cfg in candidates:
            try:
                timings[cfg] = time_config(cfg)
            except Exception:  # out of shared memory/registers on this GPU: not a candidate
                continue
        if not timings:
            raise RuntimeError(f"no tile configuration of {kind} compiled for D={D}, {dtype}")
        _cache[key] = min(timings, key=timings.get)
    return _cache[key]


def chosen_configs() -> Dict[str, str]:
    """The tile shapes picked so far, for benchmark records."""
    return {f"{k[0]}/D={k[1]}/{str(k[2]).replace('torch.', '')}/{k[3]}/rows={k[5]}": "x".join(map(str, dataclasses.astuple(v)))
            for k, v in _cache.items()}
