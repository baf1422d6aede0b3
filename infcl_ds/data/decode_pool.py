"""A rank's decode processes: started, fed, watched and stopped here, nowhere else.

The pool decodes pieces of encoded local batches (DecodePieces requests) in the order they were
planned, ahead of the engine, into a window of shared-memory slots: the engine's no-grad pass
takes its chunks from the window while the workers fill the rest of it, and during the grad
pass (which decodes nothing once chunks are kept) they decode the next local batch's first
chunks. The window is the only buffer, so its size bounds the pool's host memory (the
planner counts it: plan/memory.py).

Why not torch's DataLoader: a persistent DataLoader driven with a settable sampler works, but
its failure handling is torch's (a SIGCHLD handler that reports a dead worker as a RuntimeError
from wherever the main thread is, an iterator whose shutdown races the pool's own error). Here
a dead worker is seen through its process sentinel by the one thread that talks to the
workers, and becomes a single DataError for whoever waits; a stalled one is a DataError after
DECODE_TIMEOUT_S.

Threads and processes:
- workers: forked when the pool is built (before any batch exists: sampler.SettableSampler says
  why), each with its own pipe; a worker decodes one piece at a time into the slot it was given.
- the dispatcher thread (started at the first plan, after every fork of the build): sends each
  idle worker the next planned piece that has a free slot, receives results, frees slots whose
  device copies have completed, and notices dead workers.
- the consumer (the training loop): `take` waits for a planned piece, copies it out of its slot
  and `release`s the slot.
"""
import mmap
import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict
from multiprocessing import connection
from typing import Callable, List, Optional

import torch

from .errors import DataError
from .pinned import register_pinned

# Rows per decode task: small enough that a chunk spreads over the pool and the first piece is
# ready soon, large enough that a task's overhead (pickling its bytes, one result) is amortised.
DECODE_PIECE_ROWS = 32
# Seconds a rank waits for one decoded piece before it gives up with an error naming the rows.
DECODE_TIMEOUT_S = 600
# A worker checks this often that the rank that forked it is still alive (its pipe may stay
# open in other processes the rank forked later, so an end of file is not guaranteed).
_PARENT_CHECK_S = 5.0
# Seconds close() gives the workers to leave before they are killed.
_JOIN_S = 5.0


def window_slots(window_rows: int, workers: int) -> int:
    """Slots of DECODE_PIECE_ROWS rows that hold `window_rows` decoded rows, at least two per
    process (every process busy, one piece waiting each). The planner counts the same."""
    return max(-(-window_rows // DECODE_PIECE_ROWS), 2 * workers)


def _worker_main(pieces, conn, arena: torch.Tensor, parent: int) -> None:
    """Decode the pieces sent on `conn` into `arena`'s slots until told to stop (None), the
    pipe closes or the rank is gone. Errors in a piece go back as text: the pool goes on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle: it stops us
    torch.set_num_threads(1)  # one core per worker: the pool is the parallelism
    while True:
        try:
            if not conn.poll(_PARENT_CHECK_S):
                if os.getppid() != parent:
                    return
                continue
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        key, slot, request = task
        try:
            _, pixels, source, replaced = pieces[request]
            arena[slot, :len(pixels)].copy_(pixels)
            conn.send((key, slot, source.tolist(), replaced, None))
        except Exception as err:  # noqa: BLE001 - the piece's error, raised in the rank
            conn.send((key, slot, None, 0, str(err) if isinstance(err, DataError) else f"{type(err).__name__}: {err}"))


class DecodePoolError(DataError):
    """The pool cannot go on (a worker died or stalled, or it was closed)."""


class _Entry:
    """One planned piece: rows [lo, hi) of a batch, its request built when it is sent."""
    __slots__ = ("lo", "hi", "request", "state", "slot", "result", "error", "taken")

    def __init__(self, lo: int, hi: int, request: Callable):
        self.lo, self.hi, self.request = lo, hi, request
        self.state = "planned"  # -> sent -> ready (or failed) -> taken; dropped when skipped
        self.slot = self.result = self.error = None
        self.taken = False  # by a consumer who waits for it: not matched again


class Decoded:
    """A taken piece: `pixels` is a view of its slot, valid until `release`."""

    def __init__(self, pool, entry: _Entry):
        self._pool, self._entry = pool, entry
        self.pixels = pool.arena[entry.slot, :entry.hi - entry.lo]
        self.source, self.replaced = torch.tensor(entry.result[0], dtype=torch.int64), entry.result[1]

    def release(self, after: Optional["torch.cuda.Event"] = None) -> None:
        """The slot may take another piece (once `after`, a CUDA event recorded behind the copies
        out of it, has completed)."""
        self._pool._release(self._entry.slot, after)


class DecodePool:
    """`workers` decode processes and a window of at least `window_rows` decoded rows
    (window_slots: pieces of [DECODE_PIECE_ROWS, *image_shape] uint8 pixels), in anonymous
    shared memory the workers inherit."""

    def __init__(self, pieces, workers: int, window_rows: int, image_shape):
        if workers < 1:
            raise ValueError(f"a decode pool needs at least one worker, got {workers}")
        slots = window_slots(window_rows, workers)
        nbytes = slots * DECODE_PIECE_ROWS * int(torch.tensor(image_shape).prod())
        # MAP_SHARED | MAP_ANONYMOUS: inherited by the forked workers, freed with the last of them.
        self._map = mmap.mmap(-1, nbytes)
        self.arena = torch.frombuffer(self._map, dtype=torch.uint8).view(slots, DECODE_PIECE_ROWS, *image_shape)
        self.nbytes, self._pinned = nbytes, False
        self._lock = threading.Condition()
        self._batches: "OrderedDict[int, List[_Entry]]" = OrderedDict()  # planned pieces, in order
        self._free = list(range(slots))[::-1]
        self._releasing: list = []  # (slot, CUDA event): freed once the copies out of it are done
        self._failure: Optional[str] = None  # why the pool stopped
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        context = multiprocessing.get_context("fork")
        self._conns, self._procs, self._busy = [], [], []
        for _ in range(workers):
            ours, theirs = context.Pipe(duplex=True)
            proc = context.Process(target=_worker_main, args=(pieces, theirs, self.arena, os.getpid()),
                                   daemon=True, name="infcl-ds-decode")
            proc.start()
            theirs.close()
            self._conns.append(ours)
            self._procs.append(proc)
            self._busy.append(None)  # the entry a worker decodes
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # a wake-up never blocks its caller

    @property
    def pids(self) -> List[int]:
        return [p.pid for p in self._procs]

    # -- the consumer's side ---------------------------------------------------------------
    def plan(self, batch_id: int, pieces: List[tuple]) -> None:
        """Queue `pieces` ((lo, hi, make request), in the order they will be taken) for a batch;
        a batch planned again drops what it had planned and not taken."""
        with self._lock:
            self._check()
            if batch_id in self._batches:
                self._drop(self._batches[batch_id])
            self._batches[batch_id] = [_Entry(lo, hi, request) for lo, hi, request in pieces]
            if self._thread is None:
                self._thread = threading.Thread(target=self._dispatch_loop, daemon=True, name="infcl-ds-decode-pool")
                self._thread.start()
        self._wake()

    def forget(self, batch_id: int) -> None:
        """The batch is gone: its planned pieces are not decoded, its slots freed."""
        with self._lock:
            entries = self._batches.pop(batch_id, None)
            if entries is not None:
                self._drop(entries)
        self._wake()

    def take(self, batch_id: int, lo: int, hi: int, pin: bool = False) -> Optional[Decoded]:
        """The decoded piece [lo, hi) of the batch, waiting for it (None if it was not planned:
        the caller decodes it itself). Pieces planned before it are dropped (the consumer
        has moved past them), and so are earlier batches."""
        if pin and not self._pinned:
            self._pinned = register_pinned(self.arena)  # page-locked: copies overlap compute
        with self._lock:
            self._check()
            order = list(self._batches)
            if batch_id not in self._batches:
                return None
            for earlier in order[:order.index(batch_id)]:
                self._drop(self._batches.pop(earlier))
            entries = self._batches[batch_id]
            at = next((i for i, e in enumerate(entries) if (e.lo, e.hi) == (lo, hi) and not e.taken), None)
            if at is None:
                return None
            self._drop(entries[:at])
            entry = entries[at]
            # Out of the plan: nobody else takes it, but the dispatcher still sends it if it
            # has not yet (it is the earliest piece planned, so the next to get a slot).
            del entries[:at + 1]
            if entry.state == "planned":
                entries.insert(0, entry)
                entry.taken = True
            self._wake()
            deadline = time.monotonic() + DECODE_TIMEOUT_S
            while entry.state in ("planned", "sent") and self._failure is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._fail(f"gave no decoded piece in {DECODE_TIMEOUT_S} s (a stalled decode worker?)")
                    break
                self._lock.wait(min(left, 1.0))
            if entry.taken and entry in entries:
                entries.remove(entry)
            self._check()
            if entry.state == "failed":
                self._free_slot(entry.slot)
                raise DataError(entry.error)
            return Decoded(self, entry)

    def close(self, why: str = "was closed") -> None:
        """Stop the workers and the dispatcher and wait for them (killing a worker that does
        not leave within _JOIN_S). Later calls raise DataError naming `why`."""
        with self._lock:
            if self._failure is None:
                self._failure = why
            self._lock.notify_all()
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)
        self._stop_workers()
        if self._thread is None or not self._thread.is_alive():  # nobody waits on the wake pipe now
            with self._lock:
                # Forgotten first, closed second: a later _wake() must not write to a reused number.
                fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), None, None
            for fd in fds:
                if fd is not None:
                    os.close(fd)

    # -- shared state, under the lock --------------------------------------------------------
    def _check(self) -> None:
        if self._failure is not None:
            raise DecodePoolError(f"the decode pool {self._failure}")

    def _drop(self, entries: List[_Entry]) -> None:
        for entry in entries:
            if entry.state == "ready":
                self._free_slot(entry.slot)
            entry.state = "dropped"  # a sent one frees its slot when its result comes

    def _free_slot(self, slot: int) -> None:
        self._free.append(slot)

    def _release(self, slot: int, after) -> None:
        with self._lock:
            if after is None:
                self._free_slot(slot)
            else:
                self._releasing.append((slot, after))
        self._wake()

    def _fail(self, why: str) -> None:
        if self._failure is None:
            self._failure = why
        self._lock.notify_all()

    def _wake(self) -> None:
        with self._lock:
            if self._wake_w is not None:  # else closed: the dispatcher is gone
                try:
                    os.write(self._wake_w, b"x")
                except BlockingIOError:  # the pipe is full of wake-ups already
                    pass

    # -- the dispatcher thread ---------------------------------------------------------------
    def _next_planned(self) -> Optional[_Entry]:
        for entries in self._batches.values():
            for entry in entries:
                if entry.state == "planned":
                    return entry
        return None

    def _dispatch_loop(self) -> None:
        sentinels = {p.sentinel: i for i, p in enumerate(self._procs)}
        conns = {id(c): i for i, c in enumerate(self._conns)}
        while True:
            with self._lock:
                if self._failure is not None:
                    break
                self._free_copied()
                sends = self._assign()
                polling = bool(self._releasing)
            for worker, task in sends:
                try:
                    self._conns[worker].send(task)
                except (OSError, EOFError):
                    pass  # a dead worker: its sentinel says so below
            ready = connection.wait([*self._conns, *sentinels, self._wake_r], timeout=0.002 if polling else 1.0)
            for item in ready:
                if item == self._wake_r:
                    os.read(self._wake_r, 4096)
                elif isinstance(item, int):
                    self._worker_died(sentinels[item])
                else:
                    self._receive(conns[id(item)])
        self._stop_workers()

    def _free_copied(self) -> None:
        done = [(slot, event) for slot, event in self._releasing if event.query()]
        for slot, event in done:
            self._releasing.remove((slot, event))
            self._free_slot(slot)

    def _assign(self) -> list:
        """Idle workers get the next planned pieces that have a free slot."""
        sends = []
        idle = [worker for worker, busy in enumerate(self._busy) if busy is None]
        while idle and self._free:
            entry = self._next_planned()
            if entry is None:
                break
            request = entry.request()
            if request is None:  # its batch is gone (forget() is on its way)
                entry.state = "dropped"
                continue
            worker = idle.pop(0)
            entry.state, entry.slot = "sent", self._free.pop()
            self._busy[worker] = entry
            sends.append((worker, (id(entry), entry.slot, request)))
        return sends

    def _receive(self, worker: int) -> None:
        try:
            _key, slot, source, replaced, error = self._conns[worker].recv()
        except (EOFError, OSError):
            return  # it died: its sentinel reports it
        with self._lock:
            entry, self._busy[worker] = self._busy[worker], None
            if entry.state == "dropped":
                self._free_slot(slot)
            elif error is not None:
                entry.state, entry.error = "failed", error
            else:
                entry.state, entry.result = "ready", (source, replaced)
            self._lock.notify_all()

    def _worker_died(self, worker: int) -> None:
        proc = self._procs[worker]
        proc.join(_JOIN_S)  # its pipe closes a moment before it can be reaped
        code = proc.exitcode
        how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else
               f"exited with code {code}")
        entry = self._busy[worker]
        rows = f" while decoding local batch rows {entry.lo}-{entry.hi - 1}" if entry is not None else ""
        with self._lock:
            self._fail(f"stopped: decode worker {proc.pid} {how}{rows}")

    def _stop_workers(self) -> None:
        with self._lock:  # once: from close() or from the dispatcher, whichever comes first
            if self._stopped:
                return
            self._stopped = True
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, EOFError, ValueError):
                pass
        deadline = time.monotonic() + _JOIN_S
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(_JOIN_S)
        for conn in self._conns:
            conn.close()
