"""Top-level files the package reads (ds_configs/, docs/benchmarks/) are found from a checkout
and, after a regular `pip install .`, from PREFIX/share/infcl_ds (setup.cfg's data_files)."""
import subprocess
import sys
import zipfile

from infcl_ds import resources


def test_checkout_first_then_installed_copy(tmp_path, monkeypatch):
    repo, installed = tmp_path / "repo", tmp_path / "share"
    (installed / "ds_configs").mkdir(parents=True)
    (installed / "ds_configs" / "zero2.json").write_text("{}")
    monkeypatch.setattr(resources, "REPO", repo)
    monkeypatch.setattr(resources, "INSTALLED", installed)
    assert resources.resource("ds_configs", "zero2.json") == installed / "ds_configs" / "zero2.json"
    (repo / "ds_configs").mkdir(parents=True)
    (repo / "ds_configs" / "zero2.json").write_text("{}")
    assert resources.resource("ds_configs", "zero2.json") == repo / "ds_configs" / "zero2.json"
    # Neither: the checkout's path, so that the caller's error names where it looked first.
    assert resources.resource("docs", "x.json") == repo / "docs" / "x.json"


def test_wheel_carries_what_the_package_reads(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    str(resources.REPO), "-w", str(tmp_path)], check=True, cwd=tmp_path, timeout=300)
    (wheel,) = tmp_path.glob("infcl_ds-*.whl")
    names = {n.split("/data/share/infcl_ds/", 1)[1] for n in zipfile.ZipFile(wheel).namelist() if "/data/share/" in n}
    wanted = {f"ds_configs/zero{stage}.json" for stage in range(4)}
    wanted |= {f"docs/benchmarks/{name}.json" for name in ("loss", "train", "planner_check")}
    assert wanted <= names
