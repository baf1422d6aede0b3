"""Argument types and the parser the `infcl-ds` commands share: a bad value is one line naming
the option and the value (argparse's own `error` prints the whole usage first), exit 2."""
import argparse
import math
import sys
from typing import List

from .shown import shown


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"{self.prog}: {message} (--help lists the options)", file=sys.stderr)
        sys.exit(2)


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a whole number") from None


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def whole_number_in(low: int, high: int, high_text: str = ""):
    """An argument type: a whole number from ``low`` to ``high`` (``high_text`` names the
    upper end in the message, e.g. '2**32 - 1')."""
    def parse(text: str) -> int:
        value = whole_number(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high_text or high}, got {value}")
        return value
    return parse


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {shown(text)}")
    return value


def positive_ints(text: str) -> List[int]:
    """'8,16,32' -> [8, 16, 32], each at least 1."""
    return [positive_int(part) for part in text.split(",")]
