"""Every ``LOCKSTEP_*`` environment variable lockstep reads, fed the bad values of its kind
(issue 33's sweep): each must end in one clear line naming the variable and the value.

The variables are found in the source (any ``"LOCKSTEP_..."`` string under ``engines/`` and
``harness/``), so one added later must be given a rule in ``ENV`` (its kind and a command
that reads it) or a reason in ``NOT_SWEPT``, or ``test_every_variable_has_a_rule`` fails
naming it.

First run (main 66ee55b, before any fix): 42 cases over 8 variables; ``LOCKSTEP_GPU_COUNT``
of 40 nines planned for ever and ``LOCKSTEP_HTTP_SLOTS`` of 40 nines was taken; an empty
value of the three HTTP variables was taken as unset, which is their documented meaning (so
``""`` left the sweep's values: 39 cases, 2 unclear).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from suites.test_bad_input_fresh import Case, check_case

ROOT = Path(__file__).resolve().parent.parent
HTTP = ["run", "--packages", "tiny_llama", "--engines", "http:openai=http://127.0.0.1:9",
        "--max-new-tokens", "2", "--max-prompts", "1", "--no-evidence", "--strict"]
SERVER = ["run", "--packages", "tiny_llama", "--engines", "http:llama-server", "--no-evidence"]
CUDA = ["run", "--packages", "tiny_llama", "--engines", "native-cuda", "--no-evidence"]
DEVICES = ["run", "--packages", "tiny_llama", "--engines", "native-host", "--max-new-tokens",
           "2", "--max-prompts", "1", "--no-evidence", "--devices", "all"]
TINY = ["run", "--packages", "tiny_llama", "--engines", "native-host", "--max-new-tokens", "2",
        "--max-prompts", "1", "--no-evidence"]

# What each kind of variable may be set to wrong. An empty value is the variable unset (the
# shell's ``VAR= lockstep ...``), documented as its default, so it is not among them.
BAD = {
    "seconds": ["nan", "inf", "-1", "0", "soon", "1e999", "-inf"],
    "count": ["nan", "-1", "0", "two", "1.5", "9" * 40],
    "gpu-count": ["nan", "-1", "two", "1.5", "9" * 40],
    "switch": ["maybe", "of", "2", "yes please"],
    "folder": [lambda tmp: str(_file(tmp)), "/proc/lockstep-sweep"],
}

# variable -> (kind, the command that reads it)
ENV: dict[str, tuple[str, list[str]]] = {
    "LOCKSTEP_HTTP_TIMEOUT": ("seconds", HTTP),
    "LOCKSTEP_HTTP_STARTUP_TIMEOUT": ("seconds", SERVER),
    "LOCKSTEP_HTTP_SLOTS": ("count", SERVER),
    "LOCKSTEP_GPU_COUNT": ("gpu-count", DEVICES),
    "LOCKSTEP_STEP_MEMO": ("switch", CUDA),
    "LOCKSTEP_DEPENDENT_LAUNCH": ("switch", CUDA),
    "LOCKSTEP_NATIVE_CUDA_GRAPHS": ("switch", CUDA),
    "LOCKSTEP_PROGRAMS": ("switch", CUDA),
    "LOCKSTEP_WIDE_VERIFY": ("switch", CUDA),
    "LOCKSTEP_CACHE": ("folder", TINY),
}

# Variables not swept here, each with its reason.
NOT_SWEPT = {
    "LOCKSTEP_COMMIT": "bookkeeping: any text is recorded as the commit, nothing computed",
    "LOCKSTEP_GPU": "set by lockstep for the workers it starts (a pin), not by the user",
    "LOCKSTEP_GPUS": "set by lockstep for the workers it starts, not by the user",
    "LOCKSTEP_GPU_PINNED": "set by lockstep for the workers it starts, not by the user",
    "LOCKSTEP_GPU_LOCKS": "set by lockstep for the workers it starts, not by the user",
    "LOCKSTEP_MATRIX_PLAN": "set by lockstep for the workers it starts, not by the user",
    "LOCKSTEP_REPRO_ENGINE": "read by a repro pack's own script, not by the lockstep command",
    "LOCKSTEP_CHECKPOINTS": "llama-cpp's search path: its engine is absent here; the "
                            "batteries' env-checkpoints cases cover it with --strict",
    "LOCKSTEP_LLAMA_THREADS": "llama-cpp only (needs a GGUF); test_bad_input_third/fourth",
    "LOCKSTEP_LLAMA_SERVER": "needs a GGUF beside it; test_bad_input_third/fourth/fifth",
    "LOCKSTEP_VLLM_GPU_MEMORY": "vllm only: a GPU engine absent here",
    "LOCKSTEP_VLLM_EAGER": "vllm only: a GPU engine absent here",
    "LOCKSTEP_VLLM_PROMPT_LOGPROBS": "vllm only: a GPU engine absent here",
}


def _file(tmp: Path) -> Path:
    path = tmp / "mine.txt"
    path.write_text("my own notes\n")
    return path


def _variables() -> set[str]:
    found = set()
    for folder in ("engines", "harness"):
        for path in (ROOT / folder).rglob("*.py"):
            found |= set(re.findall(r"[\"'](LOCKSTEP_[A-Z_]+)[\"']", path.read_text()))
    return found


def test_every_variable_has_a_rule():
    found = _variables()
    missing = sorted(found - set(ENV) - set(NOT_SWEPT))
    assert not missing, f"LOCKSTEP_* variables without a rule in ENV or NOT_SWEPT: {missing}"
    stale = sorted((set(ENV) | set(NOT_SWEPT)) - found)
    assert not stale, f"ENV/NOT_SWEPT name variables lockstep no longer reads: {stale}"


@pytest.mark.parametrize("variable", sorted(ENV))
def test_bad_values_of_a_variable_end_in_one_clear_line(variable, tmp_path, capsys,
                                                        monkeypatch):
    kind, argv = ENV[variable]
    failures = []
    for i, value in enumerate(BAD[kind]):
        (tmp_path / str(i)).mkdir()
        text = value if isinstance(value, str) else value(tmp_path / str(i))
        monkeypatch.setenv(variable, text)
        needles = (variable,) if not text.strip() else (variable, text)
        try:
            check_case(Case(variable, lambda m: argv, needles), None, capsys)
        except Exception as err:  # noqa: BLE001  (every value tried, the failures listed)
            failures.append(f"{variable}={text!r}: {(str(err) or '?').splitlines()[0][:300]}")
    assert not failures, "\n".join(failures)
