"""Option values the subcommands share, checked once: an empty list, a repeated name or a
number out of its range is refused here (``InputError`` naming the option), because
argparse alone would let ``--engines ""`` mean "every engine", ``--max-prompts 0`` mean
"all prompts" and ``--factor nan`` reach a comparison that no value fails.

``integer``, ``number`` and ``existing`` are argparse ``type=`` functions: the value is
checked while the command line is read, before any work starts, and the ``InputError`` they
raise reaches ``harness.cli.main`` as one line (argparse passes on any exception but its
own). A subcommand's ``fields`` default maps the library's name of a value (``package``) to
the option the user gave it with (``--packages``): ``main`` names the option in the error.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

from engines.errors import InputError, LockstepError


def as_option(err: LockstepError, option: str) -> LockstepError:
    """``err`` naming ``option``, what the user typed, where it named the library's field."""
    err.field = option
    err.args = (err.render(),)
    return err


def existing(option: str, kind: str = "file") -> Callable[[str], Path]:
    """``type=`` for an input path that must exist as a ``file`` or a ``folder``."""
    def parse(text: str) -> Path:
        if not text.strip():  # Path("") would be the current folder
            raise InputError(f"{option} names no path", field=option, value=text,
                             remedy=f"give {option} an existing {kind}")
        path = Path(text).expanduser()
        if not (path.is_file() if kind == "file" else path.is_dir()):
            what = "does not exist" if not path.exists() else f"is not a {kind}"
            raise InputError(f"{option} {what}", field=option, value=text,
                             remedy=f"give {option} an existing {kind}")
        return path

    return parse


def path_option(option: str, kind: str = "folder") -> Callable[[str], Path]:
    """``type=`` for a path to write to (a ``kind``): an empty value is refused, where
    ``Path("")`` would quietly mean the current folder."""
    def parse(text: str) -> Path:
        if not text.strip():
            raise InputError(f"{option} names no path", field=option, value=text,
                             remedy=f"give {option} a {kind}, or leave {option} out")
        return Path(text).expanduser()

    return parse


def package_name(option: str) -> Callable[[str], str]:
    """``type=`` for a package's name: checked before any work starts against the pattern
    the package schema holds a name to, so a path (``../up``), ``.`` or an empty value is
    refused here, not after a conversion."""
    def parse(text: str) -> str:
        from engines.package.schema import PACKAGE_NAME_PATTERN  # pydantic: only when given

        if re.fullmatch(PACKAGE_NAME_PATTERN, text) is None:
            raise InputError(f"{option} takes a package name (not a path, not empty)",
                             field=option, value=text,
                             remedy="use only letters, digits, '_', '-' and '.', starting "
                                    "with a letter, digit or '_'")
        return text

    return parse


def json_output(parser, what: str) -> None:
    """``--json PATH`` (``what`` written as JSON) and ``--force``: the commands whose JSON file
    is checked (``engines.output_paths.check_output_file``) before their work starts."""
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help=f"also write {what} as JSON (checked before the work starts; an "
                             f"existing file is replaced only when lockstep wrote it)")
    parser.add_argument("--force", action="store_true",
                        help="replace a --json file that lockstep did not write")


def _span(minimum, maximum, above=None) -> str:
    """The range in words: "of at least 1", "above 0", "from 2 to 16777216"."""
    def show(v) -> str:
        return str(v) if isinstance(v, int) else f"{v:g}"

    low = f"above {show(above)}" if above is not None else \
        (None if minimum is None else f"of at least {show(minimum)}")
    if maximum is None:
        return low or "any value"
    return f"from {show(minimum)} to {show(maximum)}" if minimum is not None else \
        f"at most {show(maximum)}"


# The largest count any option takes unless it says otherwise: an int32 index's, what an
# engine can hold for a length or a count; ``--repeats 1e40`` written out would otherwise be
# taken and run for ever.
LARGEST = 2**31 - 1


def integer(option: str, minimum: int | None = 1, maximum: int | None = LARGEST
            ) -> Callable[[str], int]:
    """``type=`` for an integer option in [minimum, maximum]; a word, ``1.5``, ``1e3`` or a
    value out of range is an ``InputError`` naming ``option``, the value and the range."""
    span = _span(minimum, maximum)

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            value = None
        if value is None or (minimum is not None and value < minimum) or \
                (maximum is not None and value > maximum):
            raise InputError(f"{option} takes an integer {span}", field=option, value=text,
                             remedy=f"give {option} an integer {span}")
        return value

    return parse


def number(option: str, *, minimum: float | None = None, above: float | None = None,
           maximum: float | None = None) -> Callable[[str], float]:
    """``type=`` for a finite number ``>= minimum`` (or ``> above``) and ``<= maximum``;
    ``nan``, ``inf``, a word or a value out of range is an ``InputError`` naming ``option``."""
    span = _span(minimum, maximum, above)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or \
                (minimum is not None and value < minimum) or \
                (above is not None and value <= above) or (maximum is not None and value > maximum):
            raise InputError(f"{option} takes a finite number {span}", field=option, value=text,
                             remedy=f"give {option} a finite number {span}")
        return value

    return parse


def name_list(text: str | None, option: str) -> list[str] | None:
    """``"a,b"`` -> ["a", "b"]; None when the option was not given at all.

    Given but empty (``--engines ""``, ``--engines ,``), with a name left out (``a,,b``) or
    naming one entry twice is an ``InputError``: an empty list would otherwise fall back to
    the default (everything), and a repeated one would run the same cells twice."""
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise InputError(f"{option} names nothing", field=option, value=text,
                         remedy=f"name at least one, comma separated, or leave {option} out "
                                f"for the default")
    if len(names) != len(text.split(",")):  # "a,,b" or "a,": a name left out
        raise InputError(f"{option} leaves a name out between its commas", field=option,
                         value=text, remedy=f"name each, comma separated: {','.join(names)}")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError(f"{option} names {name!r} twice", field=option, value=text,
                             remedy=f"name each once: {','.join(dict.fromkeys(names))}")
        seen.add(name)
    return names


def engine_list(text: str | None, option: str = "--engines") -> list[str] | None:
    """``name_list`` for engines, then each resolved (``engines.registry.resolve_engine_list``):
    an unknown engine, or one engine named in two spellings (``native-host`` and
    ``engines.backends.native_host:NativeHostEngine``), is an ``InputError`` naming the
    option, as the same spelling twice is. ``lockstep run`` and ``lockstep bench`` both read
    ``--engines`` here; the library makes the same check in ``run_matrix`` and
    ``plan_bench``."""
    names = name_list(text, option)
    if names is not None:
        from engines.registry import resolve_engine_list

        try:
            resolve_engine_list(names, field=option, value=text)
        except LockstepError as err:  # an unknown engine: the registry names it "engine"
            raise as_option(err, option) if err.field == "engine" else err
    return names


def integer_list(text: str, option: str, example: str, *, increasing: bool = False
                 ) -> list[int]:
    """``"1,3"`` -> [1, 3]: integers from 1 to ``LARGEST``, comma separated, none left out
    (``1,,3``), none twice and, where ``increasing``, each above the one before; anything else
    is an ``InputError`` naming ``option`` and the whole value, with ``example`` as the form."""
    items = [item.strip() for item in text.split(",")]
    values = [int(item) if re.fullmatch(r"\d+", item) else None for item in items]
    order = " increasing" if increasing else ""
    if not items or any(v is None or not 1 <= v <= LARGEST for v in values):
        raise InputError(f"{option} takes a comma list of{order} integers from 1 to {LARGEST}",
                         field=option, value=text, remedy=f"write {option} {example}")
    if len(set(values)) != len(values) or (increasing and values != sorted(values)):
        raise InputError(f"{option} names a value twice" if len(set(values)) != len(values)
                         else f"{option} takes{order} values", field=option, value=text,
                         remedy=f"name each once{', smallest first' if increasing else ''}: "
                                f"{option} {example}")
    return values
