"""`bash tests/run.sh --gpu` runs the tests marked gpu (pytest -m gpu), not a list of files.
This guards that a test of the kernels, rings, losses or engine cannot miss that run: every
test module importing from those layers carries the marker (module-wide or on its tests), or
is listed in CPU_ONLY with the reason it has nothing of its own to run on a GPU."""
import ast
import importlib
from pathlib import Path

TESTS = Path(__file__).parent
LAYERS = ("infcl_ds.ops", "infcl_ds.parallel", "infcl_ds.losses", "infcl_ds.engine")

CPU_ONLY = {  # paths under tests/
    "data/decoding/test_encoded.py": "the encoded data path through the engine on gloo ranks; the engine on "
                                     "CUDA is engine/test_engine*.py's",
    "eval/test_export.py": "trains one step for a checkpoint to export; the engine on CUDA is engine/test_engine*.py's",
    "plan/test_plan_memory.py": "the planner's arithmetic: it reads the towers' facts and runs no kernel",
    "plan/test_plan_timing.py": "the planner's arithmetic: it reads the engine's passes and runs no kernel",
    "losses/test_validation.py": "the losses' input checks on CPU tensors: they raise before any kernel runs",
    "losses/test_loss_edges.py": "the loss API's argument checks on CPU tensors: they raise before any kernel runs",
}


def layers_imported(source: str) -> set:
    """The modules of LAYERS that ``source`` imports from, at any depth (inside test functions
    too); a name imported from infcl_ds itself counts for the module that defines it."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            if node.module.split(".")[0] == "infcl_ds":
                module = importlib.import_module(node.module)
                for alias in node.names:
                    thing = getattr(module, alias.name, None)
                    names.add(getattr(thing, "__module__", None) or getattr(thing, "__name__", None) or "")
    return {n for n in names if isinstance(n, str) and any(n == layer or n.startswith(layer + ".")
                                                           for layer in LAYERS)}


def carries_gpu_marker(source: str) -> bool:
    """``pytest.mark.gpu`` anywhere: pytestmark, a decorator or a pytest.param's marks."""
    return any(isinstance(node, ast.Attribute) and node.attr == "gpu" and ast.unparse(node.value) == "pytest.mark"
               for node in ast.walk(ast.parse(source)))


def missing_the_gpu_run(sources: dict) -> list:
    """Test files (name -> source) that exercise a layer but would not run under --gpu."""
    return sorted(name for name, source in sources.items()
                  if layers_imported(source) and not carries_gpu_marker(source) and name not in CPU_ONLY)


def read_test_files() -> dict:
    """Every test file under tests/, by its path there (ops/test_ops.py)."""
    return {path.relative_to(TESTS).as_posix(): path.read_text() for path in sorted(TESTS.rglob("test_*.py"))}


def test_every_kernel_ring_loss_and_engine_test_file_runs_under_gpu():
    missing = missing_the_gpu_run(read_test_files())
    assert missing == [], (f"{missing} import from {', '.join(LAYERS)} but carry no pytest.mark.gpu: mark them "
                           "(pytestmark = pytest.mark.gpu, or per test) or add them to CPU_ONLY with the reason")


def test_cpu_only_names_unmarked_files_that_use_a_layer():
    """A stale entry would hide a file: each one exists, imports a layer and is unmarked."""
    files = read_test_files()
    for name in CPU_ONLY:
        assert name in files, f"CPU_ONLY names {name}, which is not a test file"
        assert layers_imported(files[name]), f"{name} imports no layer: drop it from CPU_ONLY"
        assert not carries_gpu_marker(files[name]), f"{name} is marked gpu: drop it from CPU_ONLY"


def test_a_new_kernel_test_without_the_marker_is_caught():
    """The check itself, on made-up files: what it must flag and what it must let pass."""
    kernel = "from infcl_ds.ops import block_lse\n\ndef test_it():\n    block_lse\n"
    sources = {
        "test_new_kernel.py": kernel,
        "test_top_level_name.py": "def test_it():\n    from infcl_ds import sigmoid_loss\n",
        "test_module_import.py": "import infcl_ds.parallel.ring as ring\n",
        "test_marked.py": "import pytest\n" + kernel + "\npytestmark = pytest.mark.gpu\n",
        "test_one_marked.py": "import pytest\n" + kernel.replace("def test_it", "@pytest.mark.gpu\ndef test_it"),
        "test_data_only.py": "from infcl_ds.data.decoding.batch import HostBatch\nfrom infcl_ds import __version__\n",
        "losses/test_validation.py": kernel,  # listed in CPU_ONLY
    }
    assert missing_the_gpu_run(sources) == ["test_module_import.py", "test_new_kernel.py", "test_top_level_name.py"]


def test_run_sh_selects_by_the_marker():
    """--gpu passes -m gpu: a list of files there would again leave new tests out."""
    gpu_branch = (TESTS / "run.sh").read_text().split('if [ "$gpu" = 1 ]; then', 1)[1].split("\nfi\n", 1)[0]
    pytest_line = next(line for line in gpu_branch.splitlines() if "-m pytest" in line)
    assert " -m gpu " in pytest_line and "tests/" not in pytest_line, pytest_line
