"""docs/planner.md's sample report is what the planner prints now: a change to the planner that
changes the report changes the document too."""
import re
from pathlib import Path

from infcl_ds.plan.command import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "planner.md"


def test_the_sample_report_is_the_planners_output(capsys, monkeypatch):
    from test_plan_machine import CPU_NODE
    monkeypatch.setattr("infcl_ds.plan.command.read_node", lambda: CPU_NODE)  # "a machine without a GPU"
    text = DOC.read_text()
    section = text[text.index("## Output, for the 12M recipe on 32 GPUs"):]
    command = re.search(r"`infcl-ds plan (--config \S+)`", section).group(1).split()
    shown = re.search(r"```\n(.*?)```", section, re.S).group(1)
    assert main(command) == 0
    assert capsys.readouterr().out == shown


def test_the_bytes_of_a_held_sample_are_stated_as_the_code_counts_them():
    """The document states a held sample's bytes twice (the model's host memory, the recipes'
    host memory): int32 tokens and the row table held encoded, int64 tokens held decoded, as
    data/footprint.py counts them."""
    from data_section import data_section
    from infcl_ds.data.footprint import ENCODED_ROW_BYTES, sample_host_bytes
    size, context, image = 224, 77, 32768
    assert sample_host_bytes(data_section({"host_batch": "encoded"}), size, context, image) == \
        image + 4 * context + ENCODED_ROW_BYTES
    assert sample_host_bytes(data_section({"host_batch": "decoded"}), size, context, image) == \
        3 * size ** 2 + 8 * context
    text = " ".join(DOC.read_text().split())
    assert re.findall(r"(\d+)-byte row table", text) == [str(ENCODED_ROW_BYTES)] * 2
    assert "4 x context bytes of int32 tokens" in text and f"{context} int32 tokens" in text
    assert "8 x context bytes of int64 tokens" in text
    assert text.count("int64 tokens") == 1
