"""A rank's decode processes: started, fed, watched and stopped here, nowhere else.

The pool is the worker behind a DecodeQueue (decode_queue.py): it decodes the announced pieces
of encoded local batches (DecodePieces requests) in order, ahead of the engine, into a window of
shared-memory slots: the engine's no-grad pass takes its chunks from the window while the
processes fill the rest of it, and during the grad pass (which decodes nothing once chunks are
kept) they decode the next local batch's first chunks. The window is the only buffer, so its
size bounds the pool's host memory (the planner counts it: data/footprint.py).

Why not torch's DataLoader: a persistent DataLoader driven with a settable sampler works, but
its failure handling is torch's (a SIGCHLD handler that reports a dead worker as a RuntimeError
from wherever the main thread is, an iterator whose shutdown races the pool's own error). Here
a dead worker is seen through its process sentinel by the one thread that talks to the
workers, and closes the queue: one DataError for whoever waits; a stalled one is the queue's
timeout.

Threads and processes:
- workers: forked when the pool is built (before any batch exists: sampler.SettableSampler says
  why), each with its own pipe, niced below the rank (DECODE_NICENESS); a worker decodes one
  piece at a time into the slot it was given.
- the dispatcher thread (started at the first announcement, after every fork of the build):
  sends each idle worker the queue's next piece while a slot is free, hands results back to the
  queue, and notices dead workers.
- the releaser thread (started at the first slot released behind a device copy): waits, GIL
  released and without spinning, for each such copy to complete, then frees its slot and wakes
  the dispatcher. Nothing polls: a thread that woke every few milliseconds would take the
  interpreter from the thread driving the GPU that often, and on a host whose cores the decode
  processes keep busy each hand-back can cost that thread a scheduler's time slice.
- the consumer (the training loop): `take` waits for an announced piece, copies it out of its
  slot and `release`s the slot.
"""
import mmap
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from multiprocessing import connection
from queue import SimpleQueue
from typing import List, Optional

import torch

from ..errors import DataError
from ...os_thread_names import NamedThread, name_this_thread
from .decode_queue import DecodeQueue, Piece
from .pinned import register_pinned

# Rows per decode task: small enough that a chunk spreads over the pool and the first piece is
# ready soon, large enough that a task's overhead (pickling its bytes, one result) is amortised.
DECODE_PIECE_ROWS = 32
# A worker checks this often that the rank that forked it is still alive (its pipe may stay
# open in other processes the rank forked later, so an end of file is not guaranteed).
_PARENT_CHECK_S = 5.0
# Seconds close() gives the workers to leave before they are killed.
_JOIN_S = 5.0
# Added to a decode process's niceness. The pool keeps about one process per core of the rank's
# share busy, so the training process's threads (the one driving the GPU, the pool's dispatcher)
# compete with them for every core; at equal priority each wake-up of those threads can wait a
# scheduler's slice behind a decode and the GPU idles. Niced, the decoders yield to them at once and
# lose only the time those threads really use.
DECODE_NICENESS = 10


def window_slots(window_rows: int, workers: int) -> int:
    """Slots of DECODE_PIECE_ROWS rows that hold `window_rows` decoded rows, at least two per
    process (every process busy, one piece waiting each). The planner counts the same."""
    return max(-(-window_rows // DECODE_PIECE_ROWS), 2 * workers)


def _worker_main(pieces, conn, arena: torch.Tensor, parent: int) -> None:
    """Decode the pieces sent on `conn` into `arena`'s slots until told to stop (None), the
    pipe closes or the rank is gone. Errors in a piece go back as text: the pool goes on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle: it stops us
    torch.set_num_threads(1)  # one core per worker: the pool is the parallelism
    os.nice(DECODE_NICENESS)
    name_this_thread("decode-worker")  # the process, as `top` lists it
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
        slot, request = task
        started = time.perf_counter()
        try:
            _, pixels, source, replaced = pieces[request]
            arena[slot, :len(pixels)].copy_(pixels)
            conn.send((slot, source.tolist(), replaced, None, time.perf_counter() - started))
        except Exception as err:  # noqa: BLE001 - the piece's error, raised in the rank
            error = str(err) if isinstance(err, DataError) else f"{type(err).__name__}: {err}"
            conn.send((slot, None, 0, error, time.perf_counter() - started))


class Decoded:
    """A taken piece: `pixels` is a view of its slot, valid until `release` of its last use."""

    def __init__(self, pool: "DecodePool", piece: Piece):
        self._pool = pool
        self._slot, source, self.replaced = piece.result
        self._last = piece.uses == 0  # else the queue keeps it for another take (kept between passes)
        self.pixels = pool.arena[self._slot, :piece.hi - piece.lo]
        self.source = torch.tensor(source, dtype=torch.int64)

    def release(self, after: Optional["torch.cuda.Event"] = None) -> None:
        """The slot may take another piece (once `after`, a CUDA event recorded behind the copies
        out of it, has completed), after the piece's last use."""
        if self._last:
            self._pool._release(self._slot, after)


class DecodePool:
    """`workers` decode processes and a window of at least `window_rows` decoded rows
    (window_slots: pieces of [DECODE_PIECE_ROWS, *image_shape] uint8 pixels), in anonymous
    shared memory the workers inherit. `queue` is where pieces are announced and forgotten."""

    def __init__(self, pieces, workers: int, window_rows: int, image_shape):
        if workers < 1:
            raise ValueError(f"a decode pool needs at least one worker, got {workers}")
        slots = window_slots(window_rows, workers)
        nbytes = slots * DECODE_PIECE_ROWS * int(torch.tensor(image_shape).prod())
        # MAP_SHARED | MAP_ANONYMOUS: inherited by the forked workers, freed with the last of them.
        self._map = mmap.mmap(-1, nbytes)
        self.arena = torch.frombuffer(self._map, dtype=torch.uint8).view(slots, DECODE_PIECE_ROWS, *image_shape)
        self.nbytes, self._pinned = nbytes, None  # page-locked? None: not tried yet
        # Slots appended from any thread and popped by the dispatcher alone: deque's appends and
        # pops are atomic, so neither needs a lock (nor can the queue's lock wait on one).
        self._free = deque(range(slots))
        self._copies: SimpleQueue = SimpleQueue()  # (slot, CUDA event): freed once the copies out of it are done
        self._releaser: Optional[threading.Thread] = None
        self.queue = DecodeQueue("decode pool", start=self._start, wake=self._wake,
                                 release=lambda piece: self._free.append(piece.result[0]))
        self._lock = threading.Lock()  # the dispatcher's start, the wake pipe, the workers' stop
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        context = multiprocessing.get_context("fork")
        self._conns, self._procs = [], []
        self._busy: List[Optional[Piece]] = []  # the piece each worker decodes (the dispatcher's alone)
        # Rows the workers decoded and the seconds they spent on them (written by the dispatcher
        # alone): the processes' own rate, whatever the engine asked of them (`rate`).
        self.decoded_rows, self.decode_s = 0, 0.0
        for _ in range(workers):
            ours, theirs = context.Pipe(duplex=True)
            proc = context.Process(target=_worker_main, args=(pieces, theirs, self.arena, os.getpid()),
                                   daemon=True, name="infcl-ds-decode")
            proc.start()
            theirs.close()
            self._conns.append(ours)
            self._procs.append(proc)
            self._busy.append(None)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # a wake-up never blocks its caller

    @property
    def pids(self) -> List[int]:
        return [p.pid for p in self._procs]

    def rate(self) -> tuple:
        """(rows decoded, seconds the processes spent decoding them) since the pool started: their
        quotient is one process's rate on this host (the planner's is measured elsewhere)."""
        return self.decoded_rows, self.decode_s

    # -- the consumer's side ---------------------------------------------------------------
    def take(self, batch_id: int, lo: int, hi: int, pin: bool = False) -> Optional[Decoded]:
        """The queue's piece [lo, hi) of the batch in its slot (DecodeQueue.take; None: not
        announced, the caller decodes it itself). `pin`: page-lock the window first."""
        if pin and self._pinned is None:  # tried once: a refusal is not retried at every take
            self._pinned = register_pinned(self.arena)  # page-locked: copies overlap compute
            if not self._pinned:
                print(f"infcl-ds: warning: the decode window ({self.nbytes / 2**30:.2f} GiB) could not be "
                      "page-locked (cudaHostRegister refused; a memlock limit?): each copy from it to the GPU "
                      "waits for the GPU's earlier work, so the host cannot run ahead of it", file=sys.stderr, flush=True)
        piece = self.queue.take(batch_id, lo, hi)
        return None if piece is None else Decoded(self, piece)

    def close(self, why: str = "was closed") -> None:
        """Close the queue, stop the workers and the dispatcher and wait for them (killing a
        worker that does not leave within _JOIN_S). Later calls raise DataError naming `why`."""
        self.queue.close(why)
        self._copies.put(None)  # the releaser ends after the copies released before (a daemon: never waited on)
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_S)
        self._stop_workers()
        if thread is None or not thread.is_alive():  # nobody waits on the wake pipe now
            with self._lock:
                # Forgotten first, closed second: a later _wake() must not write to a reused number.
                fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), None, None
            for fd in fds:
                if fd is not None:
                    os.close(fd)

    def _release(self, slot: int, after) -> None:
        if after is None:
            self._free.append(slot)
            self._wake()
            return
        with self._lock:
            if self._releaser is None:
                self._releaser = NamedThread(target=self._release_loop, daemon=True, name="infcl-ds-decode-copies",
                                              os_name="decode-copies")
                self._releaser.start()
        self._copies.put((slot, after))

    def _release_loop(self) -> None:
        """Free each slot once the device copy out of it has completed (its event recorded with
        blocking=True: the wait sleeps), in the order they were released, until close()."""
        while True:
            item = self._copies.get()
            if item is None:
                return
            slot, copied = item
            copied.synchronize()
            self._free.append(slot)
            self._wake()

    # -- the queue's worker ------------------------------------------------------------------
    def _start(self) -> None:
        with self._lock:
            if self._thread is None and self._wake_r is not None:  # not once closed
                self._thread = NamedThread(target=self._dispatch_loop, daemon=True, name="infcl-ds-decode-pool",
                                           os_name="decode-pool")
                self._thread.start()

    def _wake(self) -> None:
        with self._lock:
            if self._wake_w is not None:  # else closed: the dispatcher is gone
                try:
                    os.write(self._wake_w, b"x")
                except BlockingIOError:  # the pipe is full of wake-ups already
                    pass

    # -- the dispatcher thread ---------------------------------------------------------------
    def _dispatch_loop(self) -> None:
        sentinels = {p.sentinel: i for i, p in enumerate(self._procs)}
        conns = {id(c): i for i, c in enumerate(self._conns)}
        while not self.queue.closed:
            for worker, task in self._assign():
                try:
                    self._conns[worker].send(task)
                except (OSError, EOFError):
                    pass  # a dead worker: its sentinel says so below
            ready = connection.wait([*self._conns, *sentinels, self._wake_r], timeout=1.0)
            for item in ready:
                if item == self._wake_r:
                    os.read(self._wake_r, 4096)
                elif isinstance(item, int):
                    self._worker_died(sentinels[item])
                else:
                    self._receive(conns[id(item)])
        self._stop_workers()

    def _assign(self) -> list:
        """Idle workers get the queue's next pieces while a slot is free: (worker, task)."""
        sends = []
        for worker in [w for w, busy in enumerate(self._busy) if busy is None]:
            got = self.queue.next_piece() if self._free else None
            if got is None:
                break
            piece, request = got
            slot = self._free.popleft()
            self._busy[worker] = piece
            sends.append((worker, (slot, request)))
        return sends

    def _receive(self, worker: int) -> None:
        try:
            slot, source, replaced, error, seconds = self._conns[worker].recv()
        except (EOFError, OSError):
            return  # it died: its sentinel reports it
        piece, self._busy[worker] = self._busy[worker], None
        self.decoded_rows += piece.hi - piece.lo
        self.decode_s += seconds
        if error is not None:
            self._free.append(slot)
            self.queue.failed(piece, DataError(error))
        elif not self.queue.done(piece, (slot, source, replaced)):
            self._free.append(slot)  # dropped meanwhile: nobody takes it

    def _worker_died(self, worker: int) -> None:
        proc = self._procs[worker]
        proc.join(_JOIN_S)  # its pipe closes a moment before it can be reaped
        code = proc.exitcode
        how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else
               f"exited with code {code}")
        piece = self._busy[worker]
        rows = f" while decoding local batch rows {piece.lo}-{piece.hi - 1}" if piece is not None else ""
        self.queue.close(f"stopped: decode worker {proc.pid} {how}{rows}")

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
