"""Data files shipped inside the package, read with importlib.resources so that every kind of
install finds them (a checkout, `pip install`, `--user`, `--target`, a zip):

calibration/  the planner's measured rates and factors, written by
              `python -m infcl_ds.plan.calibrate --write` from the benchmark JSON in docs/benchmarks/
ds_configs/   the DeepSpeed base configs a recipe starts from (zero{stage}.json)
"""
import json
from importlib import resources
from importlib.abc import Traversable


def package_file(*parts: str) -> Traversable:
    """``infcl_ds/<parts>`` wherever the package is installed."""
    return resources.files("infcl_ds").joinpath(*parts)


def read_json(*parts: str) -> dict:
    return json.loads(package_file(*parts).read_text())
