"""Package data (infcl_ds/calibration, infcl_ds/ds_configs) is found however the package is
installed: the built wheel (infcl_ds alone: no benchmarks, no tests), installed with `pip install
--target`, plans a recipe from another directory; and the shipped calibration is what
`plan.calibrate --write` makes of the benchmarks."""
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

from infcl_ds.plan import calibrate

REPO = Path(__file__).resolve().parents[1]


def test_wheel_installed_with_target_plans_from_another_directory(tmp_path):
    wheels, target, elsewhere = tmp_path / "wheels", tmp_path / "target", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # From a clean copy: a build in the checkout would leave build/lib behind, whose stale
    # files a later wheel would carry.
    source = tmp_path / "source"
    anywhere = shutil.ignore_patterns(".git", ".venv", "*.egg-info", "__pycache__", ".pytest_cache")

    def ignore(folder, names):  # build outputs and run data at the top only (infcl_ds/data is code)
        top = {"build", "dist", "runs", "data", ".whl"} if Path(folder) == REPO else set()
        return set(anywhere(folder, names)) | (top & set(names))

    shutil.copytree(REPO, source, ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                    "-w", str(wheels)], check=True, cwd=tmp_path, timeout=300)
    (wheel,) = wheels.glob("infcl_ds-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"infcl_ds"}, tops
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, cwd=tmp_path, timeout=300)
    recipe = elsewhere / "recipe.yaml"
    shutil.copy(REPO / "ds_configs" / "recipes" / "vit-b16-1m-8gpu.yaml", recipe)
    # -S: no site-packages, so neither the checkout nor an editable install can answer; the
    # dependencies come from this environment's site-packages, after the target.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DS_ACCELERATOR")}  # a plan for GPUs
    env["PYTHONPATH"] = os.pathsep.join([str(target)] + site.getsitepackages())
    where = subprocess.run([sys.executable, "-S", "-c", "import infcl_ds; print(infcl_ds.__file__)"], env=env,
                           cwd=elsewhere, capture_output=True, text=True, timeout=120, check=True)
    assert Path(where.stdout.strip()).is_relative_to(target), where.stdout
    plan = subprocess.run([sys.executable, "-S", str(target / "bin" / "infcl-ds"), "plan", "--config", str(recipe),
                           "--num_gpus", "8"], env=env, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert plan.returncode in (0, 1), plan.stderr  # 1: does not fit; 2 would be a refusal
    assert "peak per GPU" in plan.stdout, plan.stdout + plan.stderr
    # The benchmarks are not in the wheel: `infcl-ds bench` says in one line where they run.
    bench = subprocess.run([sys.executable, "-S", str(target / "bin" / "infcl-ds"), "bench", "loss", "--help"],
                           env=env, cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert (bench.returncode, bench.stdout) == (2, ""), bench.stdout + bench.stderr
    assert bench.stderr.splitlines() == ["infcl-ds: the benchmarks are not installed with the package; run them "
                                         "from a checkout of the repository: python -m benchmarks.loss [args]"]


def test_shipped_calibration_is_the_benchmarks_fit(tmp_path, capsys):
    """`python -m infcl_ds.plan.calibrate --write` rewrites the shipped files unchanged."""
    shipped = REPO / "infcl_ds" / "calibration"
    for path in shipped.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    assert calibrate.main(["--write", "--out", str(tmp_path)]) == 0
    for path in shipped.glob("*.json"):
        assert json.loads((tmp_path / path.name).read_text()) == json.loads(path.read_text()), path.name
