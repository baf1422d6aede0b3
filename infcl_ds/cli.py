"""`infcl-ds`: the command-line entry point (one subcommand per job, each in its own module)."""
import importlib
import sys
from pathlib import Path

# command -> (module, function, one-line help)
COMMANDS = {
    "train": ("infcl_ds.train", "main", "train a CLIP from a recipe (also: deepspeed --module infcl_ds.train)"),
    "eval": ("infcl_ds.eval.evaluate_checkpoint", "main", "zero-shot and retrieval evaluation of a checkpoint"),
    "export": ("infcl_ds.export", "main", "write an open_clip model folder (or --format pt state dict) from a checkpoint"),
    "plan": ("infcl_ds.plan.command", "main", "per-GPU and host memory, step time and a verdict for a recipe"),
    "data digits": ("infcl_ds.data.commands.digits", "main", "image-caption shards from scikit-learn's digits (no download)"),
    "data check": ("infcl_ds.data.commands.check", "main", "a recipe's data paths exist (run by the launch scripts first)"),
    "data photos": ("infcl_ds.data.commands.photos", "main", "JPEG shards of natural-looking images for benchmarks (no download)"),
    "demo": ("infcl_ds.demo", "main", "train-free CPU demo of the loss: exactness and memory against full logits"),
    "bench loss": ("benchmarks.loss", "main", "benchmark the loss kernels against full logits and inf-cl (GPU)"),
    "bench ring": ("benchmarks.ring", "main", "benchmark the ring across this host's GPUs against inf-cl and OpenCLIP"),
    "bench train": ("benchmarks.train", "main", "benchmark engine steps (ViT-B-16) against inf-cl's loss (GPU)"),
    "bench data": ("benchmarks.data", "main", "decode throughput of encoded host batches, beside what recipes need"),
    "bench decoders": ("benchmarks.decoder_zeroshot", "main",
                       "zero-shot accuracy of the quickstart trained with each data.decoder (GPU)"),
    "bench float8": ("benchmarks.float8_training", "main",
                     "loss curves and zero-shot accuracy of the quickstart in bf16 and with model.float8 (GPU)"),
}


# The benchmarks are not installed with the package: `infcl-ds bench` runs those of the checkout
# this package was installed from (editable), found beside it.
CHECKOUT = Path(__file__).resolve().parents[1]


def import_command(module: str):
    """The command's module; a benchmark's from the checkout beside this package, or None
    (after one line saying where to run it) when there is none, as in an installed wheel."""
    if not module.startswith("benchmarks."):
        return importlib.import_module(module)
    if (CHECKOUT / "benchmarks" / "__init__.py").is_file() and str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name not in ("benchmarks", module):
            raise
    print(f"infcl-ds: the benchmarks are not installed with the package; run them from a checkout of the "
          f"repository: python -m {module} [args]", file=sys.stderr)
    return None


def usage() -> str:
    lines = ["usage: infcl-ds <command> [args]   (infcl-ds <command> --help for its options)", "", "commands:"]
    lines += [f"  {name:<13} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def group_commands(group: str) -> dict:
    """subcommand -> one-line help of a group word ("bench": loss, ring, ...); empty if
    ``group`` is not one."""
    return {name.split(" ", 1)[1]: help_ for name, (_, _, help_) in COMMANDS.items()
            if name.startswith(group + " ")}


def group_usage(group: str) -> str:
    lines = [f"usage: infcl-ds {group} <command> [args]   (infcl-ds {group} <command> --help for its options)", "",
             f"{group} commands:"]
    lines += [f"  {name:<7} {help_}" for name, help_ in group_commands(group).items()]
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    # Two-word commands first ("bench loss"), then one word.
    for words in (2, 1):
        name = " ".join(argv[:words])
        if name in COMMANDS:
            module, function, _ = COMMANDS[name]
            loaded = import_command(module)
            if loaded is None:
                return 2
            result = getattr(loaded, function)(argv[words:])
            # Commands return an exit status; the benchmarks return their rows (success).
            return result if isinstance(result, int) else 0
    # A group word ("bench") without one of its subcommands: help for the group alone, or a
    # line naming the subcommands there are.
    subcommands = group_commands(argv[0])
    if subcommands:
        if len(argv) == 1 or argv[1] in ("-h", "--help"):
            print(group_usage(argv[0]))
            return 0
        print(f"infcl-ds: unknown {argv[0]} command {argv[1]!r}; {argv[0]} commands: {', '.join(subcommands)} "
              f"(infcl-ds {argv[0]} --help)", file=sys.stderr)
        return 2
    print(f"infcl-ds: unknown command {' '.join(argv[:2])!r}\n\n{usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
