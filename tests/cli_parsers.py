"""The argparse parsers of `infcl-ds` commands, caught where the command parses its command
line, so that tests read or try them without running the command."""
import argparse

import pytest

from infcl_ds.cli import main

_PARSE = argparse.ArgumentParser.parse_known_args


class Parsed(Exception):
    """Raised in place of running the command: its parser has parsed (or been seen)."""

    def __init__(self, parser, namespace=None):
        super().__init__(parser.prog)
        self.parser, self.namespace = parser, namespace


def _catching(monkeypatch, seen: list, parse: bool) -> None:
    def catch(parser, args=None, namespace=None):
        seen.append(parser)
        if not parser.add_help:  # a dispatcher (bench loss's --loss): the command's own parser follows
            return _PARSE(parser, args, namespace)
        raise Parsed(parser, _PARSE(parser, args, namespace)[0] if parse else None)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)


def parsers_run(argv, monkeypatch) -> list:
    """The parsers that ``infcl-ds ARGV`` parses with, up to the first one with -h."""
    seen = []
    _catching(monkeypatch, seen, parse=False)
    with pytest.raises(Parsed):
        main(list(argv))
    return seen


def parse_command(argv, monkeypatch) -> Parsed:
    """``infcl-ds ARGV`` parsed by its command's parser, nothing run: the Parsed (parser,
    namespace). A rejected command line exits as the command would (SystemExit 2)."""
    _catching(monkeypatch, [], parse=True)
    try:
        main(list(argv))
    except Parsed as parsed:
        return parsed
    raise AssertionError(f"infcl-ds {' '.join(argv)} parsed nothing")
