"""Option values the subcommands share, checked once: an empty list, a repeated name or a
count that is not positive is refused here (``InputError`` naming the option), because
argparse alone would let ``--engines ""`` mean "every engine" and ``--max-prompts 0`` mean
"all prompts"."""
from __future__ import annotations

from engines.errors import InputError
from engines.requests import check_count


def name_list(text: str | None, option: str) -> list[str] | None:
    """``"a,b"`` -> ["a", "b"]; None when the option was not given at all.

    Given but empty (``--engines ""``, ``--engines ,``) or naming one entry twice is an
    ``InputError``: an empty list would otherwise fall back to the default (everything),
    and a repeated one would run the same cells twice."""
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise InputError(f"{option} names nothing", field=option, value=text,
                         remedy=f"name at least one, comma separated, or leave {option} out "
                                f"for the default")
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

        resolve_engine_list(names, field=option, value=text)
    return names


def positive_int(value: int | None, option: str) -> int | None:
    """None (not given) or an integer >= 1; 0 or a negative count is an ``InputError``
    (``engines.requests.check_count``, the check ``run_matrix`` and ``plan_bench`` make)."""
    if value is not None:
        check_count(value, option, f"pass {option} N with N >= 1, or leave it out for all")
    return value
