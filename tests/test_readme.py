"""The README's commands (the fenced block of its Training section), read as a newcomer runs
them, in order, in a new shell after the quickstart: each program and its options exist as
written; each path a command reads is in the checkout or written by an earlier command; no two
commands write the same path, none writes into the quickstart's runs, and everything written
lands where git ignores it. Nothing is trained: the commands are parsed, not run; the
quickstart is read for what it removes."""
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import List, NamedTuple

import pytest

from cli_parsers import parse_command
from infcl_ds.config import load_recipe

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICKSTART = ROOT / "launch" / "quickstart.sh"

# Options of `infcl-ds` commands that name a path the command reads or writes, by argparse dest.
READ_OPTIONS = ("config", "checkpoint", "data")
WRITE_OPTIONS = ("out",)


class Effect(NamedTuple):
    reads: List[str]
    writes: List[str]


def readme_commands() -> List[List[str]]:
    """The Training section's bash block, one argv per line, comments dropped."""
    section = README.read_text().split("\n## Training\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md: no ```bash block in ## Training"
    return [argv for argv in (shlex.split(line, comments=True) for line in block.group(1).splitlines()) if argv]


def ignored_top_dirs() -> set:
    """The top-level directories .gitignore ignores (its '/name/' lines)."""
    return {line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
            if re.fullmatch(r"/[^/*]+/", line.strip())}


def under(path: str, folder: str) -> bool:
    return Path(path) == Path(folder) or Path(folder) in Path(path).parents


def effect_of(argv: List[str], monkeypatch) -> Effect:
    """What one README command reads and writes, once its command line is found valid."""
    program, args = argv[0], argv[1:]
    if program == "source":
        # launch/setup.sh's environment, where pip installed the infcl-ds command
        assert args == [".venv/bin/activate"], argv
        assert re.search(r"^venv=\$\{VENV:-\$root/\.venv\}$", (ROOT / "launch/setup.sh").read_text(), re.M)
        return Effect([], [])
    if program == "infcl-ds":
        try:
            namespace = vars(parse_command(args, monkeypatch).namespace)
        except SystemExit as refused:  # its one line is in the captured stderr
            raise AssertionError(f"{' '.join(argv)}: refused (exit {refused.code})") from None
        paths = lambda names: [namespace[name] for name in names if namespace.get(name)]  # noqa: E731
        return Effect(paths(READ_OPTIONS), paths(WRITE_OPTIONS))
    if program == "launch/train.sh":
        # train.sh reads its arguments in order: --help after them exits 0 only if all were valid.
        done = subprocess.run(["bash", str(ROOT / program), *args, "--help"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
        sets = [value for flag, value in zip(args, args[1:]) if flag == "--set"]
        recipe = load_recipe(ROOT / args[0], sets)
        return Effect([args[0], recipe.data.train, recipe.data.eval], [recipe.output_dir])
    if program == "hf":
        assert args[0] == "upload" and len(args) == 3, f"{' '.join(argv)}: hf upload REPO FOLDER"
        if shutil.which("hf"):
            done = subprocess.run(["hf", "upload", "--help"], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        return Effect([args[2]], [])
    raise AssertionError(f"README command {' '.join(argv)}: {program} is unknown to this test; teach it effect_of")


@pytest.fixture(scope="module")
def quickstart_run_prefix() -> str:
    """The quickstart's run directories, runs/quickstart-<UTC time>: the part before the time."""
    found = re.search(r"^run=(\S+)\$\(date", QUICKSTART.read_text(), re.M)
    assert found, "launch/quickstart.sh: no run=...$(date ...) line"
    return found.group(1)


def test_readme_commands_work_in_order_and_write_apart(monkeypatch, quickstart_run_prefix):
    commands = readme_commands()
    assert [argv[0] for argv in commands[:2]] == ["source", "infcl-ds"], "the block enters .venv first"
    ignored, written = ignored_top_dirs(), []
    for argv in commands:
        effect = effect_of(argv, monkeypatch)
        line = " ".join(argv)
        for path in effect.reads:
            by_earlier = any(under(path, earlier) for earlier in written)
            # not merely present: a checkout where the commands ran before holds runs/ and data/
            shipped = (ROOT / path).exists() and Path(path).parts[0] not in ignored
            assert by_earlier or shipped, f"{line}: reads {path}, which no earlier command writes"
        for path in effect.writes:
            assert Path(path).parts[0] in ignored, f"{line}: writes {path}, which git does not ignore"
            assert not str(path).startswith(quickstart_run_prefix), f"{line}: writes into the quickstart's {path}"
            clash = [earlier for earlier in written if under(path, earlier) or under(earlier, path)]
            assert not clash, f"{line}: writes {path}, where an earlier command wrote {clash[0]}"
            written.append(str(path))
    assert written, "the README's commands write nothing: the test read the wrong block"


def test_the_quickstart_removes_nothing():
    # Its run directory is new each time; an earlier run, the user's or its own, stays.
    for line in QUICKSTART.read_text().replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        assert not {"rm", "rmdir"} & set(words), f"launch/quickstart.sh: {line.strip()}"
