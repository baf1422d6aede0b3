"""The commit stamped on benchmark rows (benchmarks/common.py): the checkout's, marked `-dirty`
where its tracked files differ from it, so that a tree copied beside stale git metadata (a lent
GPU machine's) does not pass for the stale commit; INFCL_DS_COMMIT, the commit the tree was sent
from, wins."""
import subprocess

from benchmarks.common import run_identity, tree_commit


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_a_tree_that_differs_from_its_commit_says_so(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("a = 1\n")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True).stdout.strip()
    assert tree_commit(tmp_path) == head
    (tmp_path / "notes.txt").write_text("untracked files are not the code\n")
    assert tree_commit(tmp_path) == head
    (tmp_path / "code.py").write_text("a = 2\n")  # the copied tree's code is not the commit's
    assert tree_commit(tmp_path) == head + "-dirty"


def test_outside_a_checkout_there_is_no_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above it either
    assert tree_commit(tmp_path) == ""


def test_the_commit_a_tree_was_sent_from_wins(monkeypatch):
    monkeypatch.setenv("INFCL_DS_COMMIT", "the-sent-commit")
    assert run_identity()["commit"] == "the-sent-commit"
