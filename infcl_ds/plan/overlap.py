"""Decoding against the step's passes: how long a rank's engine waits for decoded rows in a
steady step, given its decoders' rates and windows. The planner's step time and
`data.decode_window_gib: auto` both come from here.

What it models (engine/step.py, data/decoding/encoded.py, data/decoding/decode_queue.py):

- The engine asks for a step's chunks in order: every chunk without grad (pass 1), then the
  loss, then every chunk with grad (pass 2). A chunk kept decoded on the GPU between the passes
  (data.keep_decoded_gib) needs no decoding in pass 2; a local batch of one chunk is one pass.
- Each decoder (the decode processes; the GPU decoder's lane) decodes its share of every chunk's
  rows in that order, ahead of the engine, at its rate, while the rows it holds decoded and not
  yet taken stay within its window. The next local batch is announced as soon as it is
  assembled, at the start of the step, so a decoder runs on into the next step's rows while the
  current step computes, but never further than that.
- A chunk starts once every decoder has its rows; while the engine waits, the decoders go on
  (the chunk's rows are taken piece by piece, so they do not count against the window).
- A chunk kept in the decode pool's window between the passes is the processes' alone (the
  first decoder's): with `hybrid` none of it is decoded twice.

The wait is what the engine's `decode_wait_s` measures. A step that decodes more rows than its
decoders can deliver in its compute waits at least the difference whatever the window (the
rate binds); below that, a window too small to carry the decoding of the grad pass into the next
step's first pass makes the engine wait (the window binds).
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

# Steps simulated at most before a periodic (steady) step is found; a cold start settles in a
# few.
_MAX_STEPS = 64


@dataclass(frozen=True)
class Decoder:
    """One decoder of a rank: `rate` rows per second, `window` rows it may hold decoded ahead of
    the engine (0: it decodes only what the engine waits for, as the training process does),
    `share` of every chunk's rows."""
    rate: float
    window: int
    share: float = 1.0


@dataclass(frozen=True)
class StepShape:
    """One rank's step: its local batch in chunks, the rows kept decoded on the GPU between the
    passes (whole chunks from the first) and those the decode pool keeps in its window (the
    `host_kept` after them), the engine's passes (1 or 2) and its compute, in seconds: pass 1,
    the loss, pass 2 (for one pass, its whole compute is `encode_s`)."""
    local: int
    chunk: int
    kept: int
    passes: int
    encode_s: float
    loss_s: float
    reencode_s: float
    host_kept: int = 0

    @property
    def compute_s(self) -> float:
        return self.encode_s + self.loss_s + self.reencode_s

    def events(self) -> List[Tuple[int, int, float, bool]]:
        """(rows to decode, rows leaving the window, seconds of compute after the rows are taken,
        whether the rows are the first decoder's alone) in the order the engine asks: pass 1's
        chunks, the loss, pass 2's. A chunk kept on the GPU needs no decoding in pass 2; one kept
        in the pool's window stays there from its take in pass 1 to its take in pass 2, decoded
        by the processes alone. Consecutive chunks are taken together where a pass has more than
        EVENTS_PER_PASS (a wait is then counted for the group: at most a group's compute too
        much, under 0.2% of the pass)."""
        local, chunk = self.local, self.chunk
        if self.passes == 1:
            return _grouped(0, local, chunk, self.compute_s / local, True, True)
        gpu = min(self.kept, local)
        host = min(gpu + self.host_kept, local)
        first, second = self.encode_s / local, self.reencode_s / local
        return (_grouped(0, gpu, chunk, first, True, True) + _grouped(gpu, host, chunk, first, True, False, True)
                + _grouped(host, local, chunk, first, True, True)
                + [(0, 0, self.loss_s, False)]
                + _grouped(0, gpu, chunk, second, False, False)
                + _grouped(gpu, host, chunk, second, False, True, True)
                + _grouped(host, local, chunk, second, True, True))

    @property
    def decodes(self) -> int:
        """Rows decoded per step."""
        return sum(event[0] for event in self.events())


# The most events a pass is simulated in (see StepShape.events).
EVENTS_PER_PASS = 512


def _grouped(lo: int, hi: int, chunk: int, seconds_per_row: float, decoded: bool,
             released: bool, first_only: bool = False) -> List[Tuple[int, int, float, bool]]:
    """Rows [lo, hi) in chunks of `chunk`, grouped into at most EVENTS_PER_PASS events of whole
    chunks: (rows to decode, or 0 where not `decoded`; rows leaving the window, or 0 where not
    `released`; seconds of compute; `first_only`). Rows the GPU keeps leave the window in pass 1,
    as the engine takes them."""
    if hi <= lo:
        return []
    chunks = -(-(hi - lo) // chunk)
    per_event = chunk * -(-chunks // EVENTS_PER_PASS)
    out = []
    for a in range(lo, hi, per_event):
        rows = min(a + per_event, hi) - a
        out.append((rows if decoded else 0, rows if released else 0, rows * seconds_per_row, first_only))
    return out


@dataclass(frozen=True)
class Overlap:
    """A steady step's decoding: `wait_s`, what the engine waits for decoded rows; `bound_s`, the
    least any window allows (the decoders' rate against the step's decodes)."""
    shape: StepShape
    decoders: Tuple[Decoder, ...]
    wait_s: float
    bound_s: float

    @property
    def step_s(self) -> float:
        return self.shape.compute_s + self.wait_s

    @property
    def rate_binds(self) -> bool:
        """The decoders cannot deliver the step's decodes in its compute, whatever the window."""
        return self.bound_s > 0

    @property
    def window_binds(self) -> bool:
        """A larger window would shorten the wait."""
        return self.wait_s > self.bound_s + tolerance_s(self.shape)


def tolerance_s(shape: StepShape) -> float:
    """A wait this short counts as none: 0.2% of the step's compute, at least 10 ms."""
    return max(0.01, 0.002 * shape.compute_s)


def _split(rows: int, decoders: Sequence[Decoder]) -> List[int]:
    """Each decoder's rows of a chunk of `rows`, as ChunkDecoder.split divides it: the GPU's
    (last) share rounded, the decode processes' the rest."""
    edges, total = [0], 0.0
    for decoder in decoders:
        total += decoder.share
        edges.append(round(rows * min(total, 1.0)))
    edges[-1] = rows
    return [b - a for a, b in zip(edges, edges[1:])]


def _batch_rows(shape: StepShape, decoders: Sequence[Decoder]) -> List[int]:
    """Each decoder's rows of one local batch: the chunks kept in the pool's window the first's
    alone, the others split by share."""
    rows = _split(shape.local - shape.host_kept, decoders)
    rows[0] += shape.host_kept
    return rows


def _split_event(rows: int, decoders: Sequence[Decoder], first_only: bool) -> List[int]:
    """An event's rows per decoder: all the first's where they are its alone, else _split."""
    return [rows] + [0] * (len(decoders) - 1) if first_only else _split(rows, decoders)


def steady_wait(shape: StepShape, decoders: Sequence[Decoder]) -> float:
    """Seconds the engine waits for decoded rows in a steady step (the step a long run repeats,
    after the cold first ones)."""
    if not decoders:
        return 0.0
    events = [(_split_event(need, decoders, first), _split_event(gone, decoders, first), seconds)
              for need, gone, seconds, first in shape.events()]
    per_step = [sum(needs[j] for needs, _, _ in events) for j in range(len(decoders))]
    made = [0.0] * len(decoders)    # rows decoded since the start, per decoder
    taken = [0] * len(decoders)     # rows the engine has taken (a first time)
    freed = [0] * len(decoders)     # rows that left the window
    last = None
    for step in range(_MAX_STEPS):
        # the rows announced: this step's local batch and the next, assembled meanwhile
        announced = [(step + 2) * n for n in per_step]
        ahead = tuple(round(m - t, 6) for m, t in zip(made, taken))
        wait = 0.0
        for needs, gones, seconds in events:
            late = max([(taken[j] + needs[j] - made[j]) / d.rate if d.rate > 0 else float("inf")
                        for j, d in enumerate(decoders) if needs[j] > 0] + [0.0])
            if late == float("inf"):
                return float("inf")
            for j, d in enumerate(decoders):
                if late:  # every decoder goes on while the engine waits; waited rows are taken as they come
                    room = freed[j] + d.window + (needs[j] if gones[j] else 0)
                    made[j] = max(taken[j] + needs[j], min(made[j] + d.rate * late, room, announced[j]))
                taken[j] += needs[j]
                freed[j] += gones[j]
                made[j] = max(made[j], taken[j])
                made[j] = max(taken[j], min(made[j] + d.rate * seconds, freed[j] + d.window, announced[j]))
            wait += late
        state = (ahead, round(wait, 9))
        if state == last:
            return wait
        last = state
    return wait


def rate_bound(shape: StepShape, decoders: Sequence[Decoder]) -> float:
    """The least wait any window allows: each decoder's rows of a step at its rate, beyond the
    step's compute."""
    if not decoders:
        return 0.0
    per_step = [0] * len(decoders)
    for rows, _, _, first in shape.events():
        for j, n in enumerate(_split_event(rows, decoders, first)):
            per_step[j] += n
    need = max((n / d.rate if d.rate > 0 else float("inf")) for n, d in zip(per_step, decoders) if n) \
        if any(per_step) else 0.0
    return max(0.0, need - shape.compute_s)


def overlap(shape: StepShape, decoders: Sequence[Decoder]) -> Overlap:
    decoders = tuple(decoders)
    return Overlap(shape, decoders, steady_wait(shape, decoders), rate_bound(shape, decoders))


# The window is sized for decoders this much slower than planned too: the rates are measured
# on other hosts, and a slower one needs a larger window to run through the step.
RATE_MARGIN = 0.85


def window_needed(shape: StepShape, decoders: Sequence[Decoder], which: int = 0, piece: int = 32,
                  floor: int = 0) -> int:
    """The smallest window (a multiple of `piece` rows, at least `floor`) for decoder `which`
    with which a steady step waits no longer than any larger window allows, at the planned rates
    and at RATE_MARGIN of them. At most two steps' decodes of that decoder (no decoder runs
    further ahead than the next local batch)."""
    decoders = list(decoders)
    share = _batch_rows(shape, decoders)[which]
    top = max(floor, piece * -(-2 * max(1, share) // piece), piece)
    best = floor
    for factor in (1.0, RATE_MARGIN):
        slowed = [Decoder(d.rate * factor, d.window, d.share) for d in decoders]

        def wait_with(rows: int) -> float:
            trial = list(slowed)
            trial[which] = Decoder(slowed[which].rate, rows, slowed[which].share)
            return steady_wait(shape, trial)
        least = wait_with(top) + tolerance_s(shape)
        lo, hi = floor // piece, top // piece  # wait_with(hi * piece) <= least
        if wait_with(lo * piece) <= least:
            continue
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if wait_with(mid * piece) <= least else (mid, hi)
        best = max(best, hi * piece)
    return best


def windows_needed_together(shape: StepShape, decoders: Sequence[Decoder], piece: int = 32) -> List[int]:
    """Where no decoder's window alone shortens the wait (window_needed finds its own floor), the
    windows of all decoders grown together: each from its own up to two steps' decodes, by the
    same fraction of that way, the smallest fraction with which a steady step waits no longer
    than with the largest, at the planned rates and at RATE_MARGIN of them (a hybrid rank's
    chunk starts once both decoders have its rows, so both must run on into the next step)."""
    decoders = list(decoders)
    shares = _batch_rows(shape, decoders)
    tops = [max(d.window, piece * -(-2 * max(1, share) // piece)) for d, share in zip(decoders, shares)]

    def windows(fraction: float) -> List[int]:
        return [d.window + piece * int(fraction * (top - d.window) // piece) for d, top in zip(decoders, tops)]
    best = 0.0
    for factor in (1.0, RATE_MARGIN):
        def wait_with(fraction: float) -> float:
            return steady_wait(shape, [Decoder(d.rate * factor, rows, d.share)
                                       for d, rows in zip(decoders, windows(fraction))])
        least = wait_with(1.0) + tolerance_s(shape)
        lo, hi = 0.0, 1.0
        if wait_with(lo) <= least:
            continue
        for _ in range(20):  # to a millionth of the way: finer than a piece of rows
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if wait_with(mid) <= least else (mid, hi)
        best = max(best, hi)
    return windows(best)


def describe_wait(item: Optional[Overlap]) -> str:
    """'no wait' or '12.3 s a step' (ms below a second)."""
    if item is None or item.wait_s <= tolerance_s(item.shape):
        return "no wait"
    return seconds_text(item.wait_s) + " a step"


def seconds_text(seconds: float) -> str:
    """A time as the planner prints it, in the largest unit (s, ms, us, ns) it reaches, never
    rounded to a bare zero: 1.234 -> '1.2 s', 0.0421 -> '42 ms', 0.00421 -> '4.2 ms',
    0.0000123 -> '12 us', 0 -> '0 s'."""
    if seconds >= 0.9995:  # what would read '1000 ms'
        return f"{seconds:,.1f} s"
    if seconds <= 0:
        return "0 s"
    for unit, scale in (("ms", 1e3), ("us", 1e6), ("ns", 1e9)):
        value = seconds * scale
        if value >= 0.9995 or unit == "ns":
            break
    if value < 1:
        return "under 1 ns"
    return f"{value:.0f} {unit}" if value >= 9.95 else f"{value:.2g} {unit}"
