"""training/stopped_rank_watch.py: one rank of a node names a rank of it that stays stopped,
once, while the job waits; a rank stopped at one read only, and the node's other ranks, print
nothing. The process table itself is read by training/procs.py (tests/training/test_procs.py)."""
import io
import threading

from infcl_ds.training.procs import NodeView
from infcl_ds.training.stopped_rank_watch import StoppedRankWatch


def node(mine, stopped, running=(0, 1, 2)):
    """Node 1 of a four-rank-per-node job (global ranks 4-7)."""
    return NodeView(4, mine, 4, {r: 100 + r for r in running}, dict(stopped))


def watched(views, mine=0):
    """The lines of a watch over ``views`` read in turn (the first at start), then closed."""
    done, reads = threading.Event(), iter(views)

    def view():
        found = next(reads, None)
        if found is None:
            done.set()
        return found

    out = io.StringIO()
    watch = StoppedRankWatch(4 + mine, lambda: "step 6", 60.0, poll_s=0.001, view=view, out=out).start()
    assert done.wait(10)
    watch.close()
    return out.getvalue().splitlines()


def test_a_rank_stopped_at_two_reads_in_a_row_is_named_once():
    lines = watched([node(0, {}), node(0, {})] + [node(0, {3: 103})] * 5)
    assert lines == ["infcl-ds train: rank 4, step 6: rank 7 (pid 103) is stopped (SIGSTOP, or a suspended "
                     "process): every collective waits on it, and the job ends once one has waited 1 min"]


def test_a_rank_stopped_at_one_read_or_named_by_another_rank_prints_nothing():
    blip = [node(0, {}), node(0, {3: 103}), node(0, {}), node(0, {3: 103}), node(0, {})]
    assert watched(blip) == []
    # Local rank 1 is not the node's lowest running rank: rank 0 names the stopped one.
    assert watched([node(1, {3: 103})] * 4, mine=1) == []
    # Rank 0 itself stopped: the lowest running rank names it.
    lines = watched([node(1, {0: 100}, running=(1, 2, 3))] * 4, mine=1)
    assert [line.split(": ")[1:3] for line in lines] == [["rank 5, step 6", "rank 4 (pid 100) is stopped (SIGSTOP, "
                                                                            "or a suspended process)"]]


def test_no_deepspeed_launcher_no_thread():
    watch = StoppedRankWatch(0, lambda: "start-up", 60.0, view=lambda: None).start()
    assert watch._thread is None
    watch.close()
