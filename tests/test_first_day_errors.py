"""A cluster user's first day, the hostile-input half: each problem is one line naming the value,
key or file (exit 2 where a command ends), bounded in length, and the trainer and `infcl-ds data
check` read data alike. In process, except one diverging run of the trainer."""
import csv
import io
import tarfile
from pathlib import Path

import pytest
import torch
from PIL import Image

from devices import DEVICE
from dist_utils import run_ranks
from launch_utils import TINY, data_check, start_ranks, wait_all

from infcl_ds.checkpoint.safe_load import CheckpointError
from infcl_ds.checkpoint.state_mismatch import summarize
from infcl_ds.checkpoint.tags import LATEST, resolve_tag
from infcl_ds.config import RecipeError, load_recipe
from infcl_ds.data import DataError
from infcl_ds.data.sources.csv_source import MAX_CSV_FIELD_CHARS, CsvSource
from infcl_ds.data.sources.webdataset_source import TarSource
from infcl_ds.shown import shown
from infcl_ds.training.divergence import DivergedError, check_step, check_weights
from infcl_ds.training.recipe_change import summary, trajectory_changes


@pytest.fixture(autouse=True)
def index_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFCL_DS_CACHE", str(tmp_path / "cache"))  # tar indexes not in ~/.cache


def _one_line(text: str, limit: int = 600) -> str:
    assert "\n" not in text.strip() and "Traceback" not in text and len(text) < limit, text[:2000]
    return text.strip()


def _png(tmp_path):
    Image.new("RGB", (8, 8), (200, 10, 10)).save(tmp_path / "a.png")
    return "a.png"


# -- a diverged run -----------------------------------------------------------------------

def test_divergence_is_decided_from_values_every_rank_shares(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    check_step(3, torch.tensor(1.5), 2.0, checkpoints)
    with pytest.raises(DivergedError, match=r"^step 3: the run diverged: the loss is nan; .*; no checkpoint was "
                                            r"written$"):
        check_step(3, torch.tensor(float("nan")), 2.0, checkpoints)
    checkpoints.mkdir()
    (checkpoints / LATEST).write_text("step_00000002")
    with pytest.raises(DivergedError, match=r"^step 4: the run diverged: the gradient norm is inf; .*; the last "
                                            r"checkpoint is step_00000002$"):
        check_step(4, torch.tensor(1.0), float("inf"), checkpoints)
    good, bad = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    check_weights(good.parameters(), 5, checkpoints, torch.device("cpu"), world=1)
    with torch.no_grad():
        bad.weight[0, 0] = float("inf")
    with pytest.raises(DivergedError, match="weights are no longer finite after the optimizer step, not saved"):
        check_weights(bad.parameters(), 5, checkpoints, torch.device("cpu"), world=1)


def test_features_that_cannot_give_a_finite_loss_are_a_value_error_of_their_own_type():
    """The trainer tells a diverged step by the type, not the words; API callers still catch
    ValueError, with the advice for them in the message and not in `problem`."""
    import pickle

    from infcl_ds import contrastive_loss, sigmoid_loss
    from infcl_ds.validation import NonFiniteFeaturesError
    x = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    nan = x.clone()
    nan[1, 2] = float("nan")
    for call, problem in [(lambda: contrastive_loss(nan, x, 10.0), "image_features contains NaN or Inf"),
                          (lambda: contrastive_loss(x, x, float("inf")), "logit_scale contains NaN or Inf"),
                          (lambda: sigmoid_loss(x, x, 10.0, float("nan")), "logit_bias contains NaN or Inf"),
                          (lambda: contrastive_loss(x * 1e20, x * 1e20, 10.0), "features too large for finite logits")]:
        with pytest.raises(NonFiniteFeaturesError) as err:
            call()
        assert isinstance(err.value, ValueError) and err.value.problem.startswith(problem), err.value.problem
        assert "(" not in err.value.problem and str(err.value).startswith(err.value.problem + " (")
        copy = pickle.loads(pickle.dumps(err.value))  # a spawned rank's result
        assert type(copy) is NonFiniteFeaturesError and (str(copy), copy.problem) == (str(err.value), err.value.problem)
    with pytest.raises(ValueError) as err:
        contrastive_loss(x, x[:3], 10.0)
    assert type(err.value) is ValueError  # a caller's mistake, not a divergence


def _bad_rank(rank, world, problems):
    """The loss over 2 ranks with rank r's features spoiled as problems[r] says ("nan", "rows"
    for a batch mismatch, None); what each rank raised: its type, message and problem."""
    from infcl_ds import contrastive_loss
    g = torch.Generator().manual_seed(rank)
    image, text = (torch.nn.functional.normalize(torch.randn(4, 8, generator=g), dim=-1).to(DEVICE) for _ in "it")
    if problems[rank] == "nan":
        image[0, 0] = float("nan")
    elif problems[rank] == "rows":
        text = text[:3]
    try:
        contrastive_loss(image, text, 10.0)
    except ValueError as err:
        return type(err).__name__, str(err), getattr(err, "problem", None)
    return None


@pytest.mark.gpu
def test_non_finite_features_on_one_rank_are_that_type_on_every_rank():
    """check_across_ranks shares each rank's problem with its kind: a NaN on one rank is a
    NonFiniteFeaturesError on both, naming the rank; with a caller's mistake on the other rank,
    a plain ValueError on both."""
    nan_on_1 = run_ranks(_bad_rank, 2, [None, "nan"])
    for rank in range(2):
        kind, message, problem = nan_on_1[rank]
        assert kind == "NonFiniteFeaturesError", nan_on_1
        assert problem == "contrastive_loss: bad input on rank 1: image_features contains NaN or Inf", problem
        assert message.startswith(problem + " (pass check_finite=False")
    assert nan_on_1[0] == nan_on_1[1]
    mixed = run_ranks(_bad_rank, 2, ["rows", "nan"])
    for rank in range(2):
        kind, message, problem = mixed[rank]
        assert kind == "ValueError" and problem is None, mixed
        assert "rank 0: batch mismatch" in message and "rank 1: image_features contains NaN or Inf" in message


@pytest.mark.slow
def test_a_diverged_run_names_its_step_and_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    code = wait_all(start_ranks(1, [f"output_dir={run}", "optimizer.lr=1e30", "schedule.warmup_steps=0",
                                    "schedule.steps=4", "checkpoint.every=1"], log_dir=tmp_path))
    log = (tmp_path / "rank0.log").read_text()
    assert code == [2], log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if line.startswith("infcl-ds train:")]
    assert len(lines) == 1 and "step 2: the run diverged: image_features contains NaN or Inf" in lines[0], lines
    assert lines[0].endswith("the last checkpoint is step_00000001"), lines
    tags = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert tags == ["step_00000001"]
    resolve_tag(run / "checkpoints")  # complete; its weights were checked finite before the save


# -- CSVs: long captions, a byte order mark -------------------------------------------------

def test_long_captions_are_read_alike_by_the_trainer_anddata_check(tmp_path, capsys):
    image = _png(tmp_path)
    table = tmp_path / "long.csv"
    with table.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filepath", "title"])
        writer.writerow([image, "x" * 200_000])  # over csv's default 131,072
        writer.writerow([image, "a red square"])
    assert len(CsvSource(table, "filepath", "title").captions[0]) == 200_000
    code, out = data_check(capsys, "data.source=csv", f"data.train={table}")
    assert code == 0, out.err

    with table.open("a", newline="") as f:
        csv.writer(f).writerow([image, "y" * (MAX_CSV_FIELD_CHARS + 1)])
    expected = f"CSV {table} line 4: a field is longer than {MAX_CSV_FIELD_CHARS:,} characters"
    with pytest.raises(DataError, match="^" + expected):
        CsvSource(table, "filepath", "title")
    code, out = data_check(capsys, "data.source=csv", f"data.train={table}")
    assert code == 2 and _one_line(out.err).startswith(f"infcl-ds data check: {expected}")


def test_a_csv_with_a_byte_order_mark_is_read(tmp_path, capsys):
    image = _png(tmp_path)
    table = tmp_path / "excel.csv"
    table.write_text(f"filepath,title\n{image},a red square\n", encoding="utf-8-sig")
    assert table.read_bytes().startswith(b"\xef\xbb\xbf")
    assert CsvSource(table, "filepath", "title").images == [image]
    code, out = data_check(capsys, "data.source=csv", f"data.train={table}")
    assert code == 0, out.err


# -- a shard cut short ----------------------------------------------------------------------

def test_a_shard_cut_inside_a_tar_header_is_reported(tmp_path, capsys):
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    whole = tmp_path / "whole.tar"
    with tarfile.open(whole, "w") as tar:
        for i in range(32):
            for ext, data in (("png", png.getvalue()), ("txt", b"a caption")):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with tarfile.open(whole) as tar:
        header = next(m for m in tar.getmembers() if m.name == "0020.png").offset
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole.read_bytes()[:header + 100])  # a copy that stopped inside sample 20's header

    assert len(TarSource(str(whole))) == 32 and capsys.readouterr().err == ""
    assert len(TarSource(str(cut))) == 20
    warning = _one_line(capsys.readouterr().err)
    assert warning.startswith(f"infcl-ds: warning: shard {cut} is cut short") and "20 sample(s) read" in warning
    code, out = data_check(capsys, "data.source=webdataset", f"data.train={cut}")
    assert code == 2
    assert _one_line(out.err).startswith(f"infcl-ds data check: shard {cut} is cut short"), out.err
    assert "20 sample(s) read from it" in out.err


# -- output_dir, latest, a changed model ----------------------------------------------------

@pytest.mark.parametrize("name, why", [('"runs/a\\0b"', "output_dir must not contain a NUL character"),
                                       ("runs/" + "n" * 300, "output_dir has a name of 300 bytes")])
def test_an_unusable_output_dir_is_one_line_at_load(tmp_path, name, why):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY.read_text().replace("output_dir: runs/tiny-cpu", f"output_dir: {name}"))
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    assert _one_line(str(err.value)).startswith(f"recipe: {why}")


def test_latest_holding_a_nul_is_named(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / LATEST).write_bytes(b"step_\x0000000001")
    with pytest.raises(CheckpointError) as err:
        resolve_tag(checkpoints)
    assert _one_line(str(err.value)).startswith(f"{checkpoints / LATEST} does not hold a tag name")


def test_a_changed_model_is_a_short_summary():
    saved = "model:\n  name: infcl-tiny\nschedule:\n  steps: 10\noptimizer:\n  lr: 0.1\n  eps: 1.0e-8\n" \
            "  weight_decay: 0.2\ndata:\n  train: [" + ", ".join(f"s{i}.tar" for i in range(2000)) + "]\n"
    current = "model:\n  name: infcl-tiny-digits\nschedule:\n  steps: 20\noptimizer:\n  lr: 0.2\n  eps: 1.0e-6\n" \
              "  weight_decay: 0.1\ndata:\n  train: [t.tar]\n"
    line = _one_line(summary(trajectory_changes(saved, current)))
    assert line.startswith("model.name: 'infcl-tiny' -> 'infcl-tiny-digits'") and line.endswith("; and 1 more")
    assert "characters)" in line  # the 2000 shards, cut short

    old = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 4), torch.nn.Linear(4, 4))
    new = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Linear(8, 4))
    with pytest.raises(RuntimeError) as err:
        new.load_state_dict(old.state_dict())
    assert summarize(err.value) == ("3 shape(s) differ (first: 0.weight: [3, 2] saved, [8, 2] here); "
                                    "2 key(s) the model does not have (first: 2.weight)")


# -- bounded values --------------------------------------------------------------------------

def test_error_lines_quote_at_most_a_bounded_part_of_a_value(tmp_path):
    assert shown("abc") == "'abc'"
    assert shown("x" * 10_000_000) == repr("x" * 200) + "... (10,000,000 characters)"
    # unquoted (a path in a sentence): printable characters as they are, the others escaped
    assert shown(Path("/data/é/a\n\x1b[31m\u202e.tar"), quote=False) == "/data/é/a\\n\\x1b[31m\\u202e.tar"
    assert shown("\n" * 300, quote=False) == "\\n" * 200 + "... (300 characters)"
    huge = "y" * 1_000_000  # a 10 MB value reads the same, only slower
    for sets in (["model.loss=" + huge], [huge], ["batch.global=" + huge]):
        with pytest.raises(RecipeError) as err:
            load_recipe(TINY, sets)
        _one_line(str(err.value))
    table = tmp_path / "wide.csv"
    table.write_text(",".join(["z" * 100_000] * 50) + "\n")
    with pytest.raises(DataError) as err:
        CsvSource(table, "filepath", "title")
    _one_line(str(err.value))
