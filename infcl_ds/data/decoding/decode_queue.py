"""The decode pieces announced for a rank's local batches, in the order the engine will take
them: the queue between the training loop and a decoder's worker, the same for every worker.
The process pool's dispatcher thread (decode_pool.py) and the GPU decoder's lane thread
(device_lane.py) each pull pieces from a queue of their own and hand the results back; the
training loop takes them.

A piece is announced, then decoding (a worker made its request and decodes it), then ready or
failed; it is taken as many times as it was announced for (`uses`: 2 for rows kept decoded
between the engine's passes; it stays ready, its pixels held, until the last). It is dropped,
never decoded or never taken, when the consumer moves past it (a piece announced before the one
it takes and not taken yet, or an earlier batch), when its batch is forgotten (collected) or
announced again, or when the queue closes.

A worker behind the queue is told three things, each optional:
- `start()`: at the first announcement, so that its thread starts after every fork of the
  build (sampler.SettableSampler says why);
- `wake()`: something it may act on changed (a piece announced or taken, room freed, the queue
  closed); a worker that waits in `next_piece(wait=True)` needs none;
- `release(piece)`: a decoded piece nobody will take: free what holds its pixels (a slot).

A consumer waits DECODE_TIMEOUT_S at most for a piece; then the queue closes, and every wait and
later call raises DecodeStopped naming why, in one line.
"""
import threading
from collections import OrderedDict, deque
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import DataError

# Seconds a rank waits for one decoded piece before it gives up with an error.
DECODE_TIMEOUT_S = 600

ANNOUNCED, DECODING, READY, FAILED, DROPPED = "announced", "decoding", "ready", "failed", "dropped"


class DecodeStopped(DataError):
    """A queue that cannot go on: its worker died or stalled, or it was closed."""


class Piece:
    """Rows [lo, hi) of a batch. `request()` makes its decode request (None once the batch is
    gone); `result` is what the worker handed back, `error` what it raised; `uses`, the takes it
    has left (after a take: 0 on its last)."""
    __slots__ = ("lo", "hi", "request", "state", "result", "error", "taken", "counted", "uses", "given", "index",
                 "gone")

    def __init__(self, lo: int, hi: int, request: Callable, uses: int = 1):
        self.lo, self.hi, self.request = lo, hi, request
        self.state = ANNOUNCED
        self.result = self.error = None
        self.taken = False  # a consumer waits for it: not matched again (until its next use)
        self.counted = False  # its rows are in the queue's count of rows held (the window's)
        self.uses, self.given = uses, 0  # takes left, takes so far
        self.index = 0  # its place in its batch's announced order
        self.gone = False  # out of its batch: taken for the last time, or dropped


# What a removed piece leaves in its batch's order: gone, so every walk over the order skips it.
_REMOVED = Piece(0, 0, lambda: None)
_REMOVED.gone = True


class BatchPieces:
    """A batch's announced pieces in order, each found by its rows in constant time however many
    there are (a local batch of millions of rows is tens of thousands of pieces, and the pieces
    taken once and wanted again, the rows kept between the passes, stay among them)."""

    def __init__(self, pieces: List[Piece]):
        self._order = pieces
        self._front = 0  # the pieces before it were taken or passed
        self._by_rows: Dict[Tuple[int, int], deque] = {}
        for index, piece in enumerate(pieces):
            piece.index = index
            self._by_rows.setdefault((piece.lo, piece.hi), deque()).append(piece)

    def __iter__(self):
        return (piece for piece in self._order if not piece.gone)

    def holds(self, piece: Piece) -> bool:
        return not piece.gone and piece.index < len(self._order) and self._order[piece.index] is piece

    def find(self, lo: int, hi: int) -> Optional[Piece]:
        """The first piece of rows [lo, hi) nobody waits for."""
        return next((p for p in self._by_rows.get((lo, hi), ()) if not p.taken), None)

    def pass_to(self, piece: Piece) -> List[Piece]:
        """The consumer takes `piece`: the pieces announced before it that it never took, now out
        of the batch (those taken before and wanted again stay)."""
        passed = [p for p in self._order[self._front:piece.index] if not p.gone and not p.given]
        for p in passed:
            self.remove(p)
        self._front = max(self._front, piece.index + 1)
        return passed

    def remove(self, piece: Piece) -> None:
        """`piece` out of the batch, and out of its order too: a taken piece's result (the lane's
        decoded pixels) must not outlive its consumer's use while the batch lives on."""
        piece.gone = True
        self._order[piece.index] = _REMOVED
        same = self._by_rows[(piece.lo, piece.hi)]
        if same[0] is piece:
            same.popleft()
        else:
            same.remove(piece)
        if not same:
            del self._by_rows[(piece.lo, piece.hi)]


class DecodeQueue:
    """Announced pieces per batch id, batches in the order they were announced. `window_rows`:
    at most that many decoded rows wait in the queue (decoding or ready; one piece at least),
    or None where the worker bounds them itself (the pool's slots). `name` says whose queue it
    is in errors ("the decode pool ...")."""

    def __init__(self, name: str, *, window_rows: Optional[int] = None, start: Optional[Callable] = None,
                 wake: Optional[Callable] = None, release: Optional[Callable] = None):
        self.name, self._window = name, window_rows
        self._start, self._wake, self._release = start, wake, release
        # Re-entrant (an RLock): a batch collected while this thread holds it calls forget().
        self._cond = threading.Condition()
        self._batches: "OrderedDict[int, BatchPieces]" = OrderedDict()
        # What the worker's next request needs in constant time, however many pieces a local batch
        # of millions of rows announces: the announced pieces in order (those no longer announced
        # are skipped when met), and the rows decoding or ready (what the window counts).
        self._pending: "deque[Piece]" = deque()
        self._held_rows = 0
        self._started = False
        self._closed: Optional[str] = None

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def queued(self) -> Dict[int, List[Tuple[int, int, str]]]:
        """(lo, hi, state) of every piece in the queue, per batch id, in order."""
        with self._cond:
            return {batch: [(p.lo, p.hi, p.state) for p in pieces] for batch, pieces in self._batches.items()}

    # -- the consumer's side -------------------------------------------------------------------
    def announce(self, batch_id: int, pieces: Sequence[tuple]) -> None:
        """`pieces` ((lo, hi, make request[, uses]), in the order they will be taken first) of a
        batch; a batch announced again drops what it had announced and not taken, and keeps its
        place."""
        with self._cond:
            self._check()
            self._drop(self._batches.get(batch_id, ()))
            self._batches[batch_id] = BatchPieces([Piece(*piece) for piece in pieces])
            # A batch announced again keeps its place: the order is rebuilt (once a batch, a step).
            self._pending = deque(p for batch in self._batches.values() for p in batch if p.state == ANNOUNCED)
            first, self._started = not self._started, True
            self._cond.notify_all()
        if first and self._start is not None:
            self._start()
        self._wake_worker()

    def forget(self, batch_id: int) -> None:
        """The batch is gone: its pieces are not decoded, nor kept."""
        with self._cond:
            self._drop(self._batches.pop(batch_id, ()))
            self._cond.notify_all()
        self._wake_worker()

    def take(self, batch_id: int, lo: int, hi: int) -> Optional[Piece]:
        """The decoded piece [lo, hi) of the batch, waiting for it; None if it was not announced
        (or its batch was let go meanwhile): the caller decodes it itself. Pieces announced
        before it, and earlier batches, are dropped: the consumer has moved past them. A piece
        that failed raises its worker's error."""
        with self._cond:
            self._check()
            piece = self._claim(batch_id, lo, hi)
        self._wake_worker()  # it is first in line now, and what was dropped left room
        if piece is None:
            return None
        with self._cond:
            decoded = self._cond.wait_for(lambda: piece.state not in (ANNOUNCED, DECODING) or self.closed,
                                          DECODE_TIMEOUT_S)
            pieces = self._batches.get(batch_id)
            if decoded and pieces is not None and pieces.holds(piece):
                piece.uses, piece.given = piece.uses - 1, piece.given + 1
                if piece.uses > 0 and piece.state == READY:  # taken again later: its pixels stay held
                    piece.taken = False
                else:
                    pieces.remove(piece)
                    self._count(piece, False)  # its rows left the window
                self._cond.notify_all()
        if not decoded:  # dropped with the rest: its worker frees what holds it
            self.close(f"gave no decoded piece in {DECODE_TIMEOUT_S} s (a stalled decoder?)")
        self._check()
        if piece.state == FAILED:
            raise piece.error
        return piece if piece.state == READY else None

    def close(self, why: str = "was closed") -> None:
        """No more pieces: waits and later calls raise DecodeStopped naming `why` (the first
        reason given wins)."""
        with self._cond:
            if self._closed is None:
                self._closed = why
            for pieces in self._batches.values():
                self._drop(pieces)
            self._batches.clear()
            self._pending.clear()
            self._cond.notify_all()
        self._wake_worker()

    # -- the worker's side ---------------------------------------------------------------------
    def next_piece(self, wait: bool = False) -> Optional[Tuple[Piece, Any]]:
        """The earliest announced piece that has room in the window, now decoding, and its
        request; None if there is none (with `wait`: None once the queue closes)."""
        while True:
            with self._cond:
                piece = self._next()
                while piece is None and wait and not self.closed:
                    self._cond.wait()
                    piece = self._next()
                if piece is None or self.closed:
                    return None
                self._set(piece, DECODING)
            request = piece.request()  # outside the lock: it copies the piece's bytes
            if request is not None:
                return piece, request
            with self._cond:  # its batch is gone (forget() is on its way)
                if piece.state == DECODING:
                    self._set(piece, DROPPED)
                self._cond.notify_all()

    def done(self, piece: Piece, result) -> bool:
        """The worker decoded `piece`. False if nobody will take it (dropped meanwhile): the
        worker frees what holds it."""
        with self._cond:
            if piece.state != DECODING:
                return False
            piece.result = result
            self._set(piece, READY)
            self._cond.notify_all()
            return True

    def failed(self, piece: Piece, error: BaseException) -> None:
        """The worker could not decode `piece`: `error` is raised where it is taken."""
        with self._cond:
            if piece.state == DECODING:
                piece.error = error
                self._set(piece, FAILED)
                self._cond.notify_all()

    # -- under the lock ------------------------------------------------------------------------
    def _check(self) -> None:
        if self._closed is not None:
            raise DecodeStopped(f"the {self.name} {self._closed}")

    def _claim(self, batch_id: int, lo: int, hi: int) -> Optional[Piece]:
        if batch_id not in self._batches:
            return None
        order = list(self._batches)
        for earlier in order[:order.index(batch_id)]:
            self._drop(self._batches.pop(earlier))
        pieces = self._batches[batch_id]
        piece = pieces.find(lo, hi)
        if piece is None:
            self._cond.notify_all()
            return None
        self._drop(pieces.pass_to(piece))
        piece.taken = True  # still announced, or ready: the worker's next piece, or the consumer's
        self._cond.notify_all()
        return piece

    def _set(self, piece: Piece, state: str) -> None:
        """The piece's new state; its rows count against the window while it decodes or waits."""
        piece.state = state
        self._count(piece, state in (DECODING, READY))

    def _count(self, piece: Piece, held: bool) -> None:
        if piece.counted != held:
            piece.counted = held
            self._held_rows += (piece.hi - piece.lo) * (1 if held else -1)

    def _drop(self, pieces: Iterable[Piece]) -> None:
        for piece in pieces:
            if piece.state == READY and self._release is not None:
                self._release(piece)
            self._set(piece, DROPPED)  # a decoding one: its worker frees it when it is done

    def _next(self) -> Optional[Piece]:
        """The earliest announced piece, taken off the pending order, if the window has room for it."""
        while self._pending and self._pending[0].state != ANNOUNCED:
            self._pending.popleft()  # decoding, dropped or gone since it was announced
        if not self._pending:
            return None
        piece, held = self._pending[0], self._held_rows
        if self._window is not None and held and held + piece.hi - piece.lo > self._window:
            return None
        return self._pending.popleft()

    def _wake_worker(self) -> None:
        if self._wake is not None:
            self._wake()

