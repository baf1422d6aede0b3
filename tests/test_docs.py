"""The documents (README.md, docs/*.md) state what the code does, not how its test suite
fared: a count of tests that passed, a suite's time or a streak of runs goes stale with the next
test added or the next machine, and nothing checks it. Such a figure belongs in a CI log."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# "569 passed, 4 skipped in 14:16" (pytest's summary), "569 tests pass", "12 new tests": a count
# of tests. "rank 0 failed in the all-reduce" is not one: pytest's counts end the clause.
TEST_COUNT = re.compile(r"\b\d[\d,]*\s+(?:passed|failed|skipped|xfailed|xpassed|errors?|deselected)\b"
                        r"(?=\s*(?:[,.;)*]|\bin\s+\d|$))"
                        r"|\b\d[\d,]*\s+(?:[a-z-]+\s+){0,2}?tests?\b(?![/\w`.-]|\.py)", re.I)
# "passed 30 runs in a row", "10 times in a row": a streak.
STREAK = re.compile(r"\b\d[\d,]*\s+(?:runs|times|repetitions)\s+in\s+a\s+row\b", re.I)
# "14:16", "14 minutes", "855 s": a duration, which in a sentence about the suite or the tests
# is the suite's time. "tests" as a word, not a path (tests/...) or a module (test_x.py).
DURATION = re.compile(r"\b\d+(?::\d\d|\.\d+)?\s*(?:minutes?|mins?|hours?|seconds?|s|h)\b|\b\d+:\d\d\b", re.I)
ABOUT_TESTS = re.compile(r"(?<![\w/`.-])(?:suite|tests?)(?![\w/`-]|\.py)", re.I)


def sentences(text: str):
    """(line, sentence) for each sentence of the document's prose: a paragraph, a list item or a
    table cell split at its full stops. Fenced blocks and `code spans` are left out (commands,
    error lines and program output: the code prints their numbers)."""
    fenced, block = False, []            # block: the (line, text) of the paragraph being read
    for number, line in enumerate(text.splitlines() + [""], 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        starts_item = re.match(r"\s*(?:[-*]|\d+\.)\s", line) is not None
        if block and (not line.strip() or starts_item or line.startswith("|")):
            yield from _split(block)
            block = []
        if line.startswith("|"):         # a table row: each cell on its own
            for cell in line.split("|"):
                yield from _split([(number, cell)])
        elif line.strip():
            block.append((number, line.strip()))


def _split(block):
    """Sentences of a block of (line, text), each with the block's first line."""
    prose = re.sub(r"`[^`]*`", "`code`", " ".join(text for _, text in block))
    for sentence in re.split(r"(?<=[.;!?])\s+(?=[A-Z`(*])", prose):
        yield block[0][0], sentence


def stale_figures(text: str):
    """(line, sentence) for each sentence that states a test count, a streak or the suite's time."""
    for line, sentence in sentences(text):
        if TEST_COUNT.search(sentence) or STREAK.search(sentence) or \
                (ABOUT_TESTS.search(sentence) and DURATION.search(sentence)):
            yield line, sentence


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_no_document_states_a_test_count_or_a_suite_time(doc):
    found = list(stale_figures(doc.read_text()))
    assert not found, f"{doc.name} states how the tests fared (say what the code does instead): " + \
        "; ".join(f"line {line}: {sentence[:160]!r}" for line, sentence in found)


@pytest.mark.parametrize("sentence", [
    "The suite, twice in a row: **569 passed, 4 skipped in 14:16 and 14:15**.",
    "569 tests pass in 14 minutes.",
    "`pytest tests/data/decoding/test_encoded.py` passed 30 runs in a row on the 2-core machine.",
    "The suite takes about 14 minutes on the 2-core machine.",
    "Where the time goes: the 30 slowest tests take 558 s of the 855.",
    "| 8 | the tests ran in 75-110 s on gloo |",
])
def test_a_test_count_or_suite_time_is_found(sentence):
    assert list(stale_figures(sentence + "\n"))


@pytest.mark.parametrize("sentence", [
    "A stopped rank costs the timeout: rank 0 exits in < 90 s (`tests/training/test_ring.py`).",
    "`test_stopped_peer_ends_the_job_within_the_timeout` (two gloo ranks, 1-minute timeout).",
    "The float64 self-check passed first; every row within the 120 s budget.",
    "The decode pool is the project's own (`tests/data/decoding/test_encoded.py`).",
    "3 steps, the mean of the 2 after the first; the two-node run took 13.31 s a step.",
    "Rank 0 failed in the all-reduce, 1 failed to start; 2 skipped samples a step.",
])
def test_statements_about_the_code_are_not_flagged(sentence):
    assert not list(stale_figures(sentence + "\n"))
