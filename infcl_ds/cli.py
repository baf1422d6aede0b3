"""`infcl-ds`: the command-line entry point (one subcommand per job)."""
import sys

USAGE = """usage: infcl-ds <command> [args]

commands:
  demo            train-free CPU demo of the loss: exactness and memory against full logits
  bench loss      benchmark the loss kernels against full logits and inf-cl (GPU)
  bench ring      benchmark the ring across this host's GPUs against inf-cl and OpenCLIP
"""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from .demo import main as demo
        return demo(rest)
    if cmd == "bench":
        if not rest or rest[0] not in ("loss", "ring"):
            print("usage: infcl-ds bench {loss,ring} [args]  (see --help)", file=sys.stderr)
            return 2
        if rest[0] == "loss":
            from .bench.loss import main as bench_main
        else:
            from .bench.ring import main as bench_main
        bench_main(rest[1:])
        return 0
    print(f"infcl-ds: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
