"""The command line's parser: argparse's own errors (an unknown option or command, a choice
not offered, a required option left out) as one ``InputError`` line naming the argument and
the help to read, where argparse would print its usage block and exit on its own.

Subparsers are made of the same class (``add_subparsers`` uses the parent's), so every
command's errors go through ``error``; ``harness.cli.main`` prints the line and returns 2.
"""
from __future__ import annotations

import argparse
import difflib
import re

from engines.errors import InputError


# What argparse takes for a value rather than an option: its own ``-1`` and ``-.5``, and also
# anything else starting with ``-`` and a digit (``-1e3``, ``-1/2``, ``-1,2``), ``-inf`` and
# ``-nan``, which it would otherwise refuse as "expected one argument", without the value.
NEGATIVE_NUMBER = re.compile(r"^-(\.?\d|inf|nan)", re.I)


class LockstepParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but arguments nothing took are refused by the (sub)command that
        was reading them, so the remedy points at that command's help."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            _command_parser(self, parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def error(self, message: str):
        """argparse's ``message`` as an ``InputError``: the argument it names is the field
        (with the value, for a choice not offered), the remedy the closest choices and the
        help of the command that refused it."""
        field, value, remedy = None, None, f"see {self.prog} --help"
        named = re.match(r"argument ([^:]+): (.*)", message)
        if named:
            field = named[1]
            chosen = re.match(r"invalid choice: '?(.*?)'? \(choose from (.*)\)$", named[2])
            if chosen:
                value = chosen[1]
                offered = [c.strip(" '") for c in chosen[2].split(",")]
                close = difflib.get_close_matches(value, offered, n=3)
                if close:
                    remedy = f"did you mean {' or '.join(close)}? ({remedy})"
        else:
            listed = re.match(r"(unrecognized arguments|the following arguments are "
                              r"required): (.*)", message)
            field = listed[2] if listed else None
        raise InputError(message, field=field, value=value, remedy=remedy)


def _command_parser(parser: argparse.ArgumentParser,
                    parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub)command parser ``parsed`` was read by (``lockstep cache prune``)."""
    while True:
        chosen = next((action.choices[getattr(parsed, action.dest)]
                       for action in parser._actions
                       if isinstance(action, argparse._SubParsersAction)
                       and getattr(parsed, action.dest, None) in action.choices), None)
        if chosen is None:
            return parser
        parser = chosen
