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
