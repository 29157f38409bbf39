"""Plain helpers for the suites (importable; conftest.py holds only fixtures)."""
from __future__ import annotations

import json
from pathlib import Path

HOST_ENGINES = ("ort-cpu", "onnx-reference", "native-host")


def write_figure(evidence_dir, name: str, data) -> None:
    """Keep a GPU test's measured series under ``<evidence dir>/figures/<name>.json`` (the
    evidence write-up quotes them; the assertions stay in the test)."""
    figures = Path(evidence_dir) / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    (figures / f"{name}.json").write_text(json.dumps(data, indent=1))


def one_line_error(capsys, argv, status: int = 2) -> str:
    """``lockstep ARGV``'s error: exit ``status`` (2: bad input; 1: a run that failed), no
    traceback, exactly one ``lockstep: error: `` line on stderr and it comes last (after any
    progress lines)."""
    from harness.cli import main

    got = main(argv)
    err = capsys.readouterr().err
    assert got == status, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("lockstep: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    return errors[0]


def fixture_names() -> list[str]:
    from harness.packages import fixture_names as names

    return names()


def device_greedy_matches_oracle(engine, package, prompt, new_tokens: int,
                                 pipelined: bool = False):
    """Greedy on a device engine under the transfer guard in ``disallow`` mode: the oracle's
    tokens, nothing staged (ledger and guard), exactly 4 bytes read back a token (ledger and
    guard agree). ``pipelined``: the loop that queues each next forward before the id is
    read. Returns the decode result for engine-specific checks."""
    from engines.oracle import oracle_decode
    from engines.workflow import greedy_decode
    from harness.transfer_guard import transfer_guard

    oracle = oracle_decode(package, prompt, new_tokens)
    with transfer_guard("disallow") as guard:
        result = greedy_decode(engine, prompt, new_tokens, pipelined=pipelined)
    assert result.tokens == oracle.tokens
    ledger = result.ledger
    assert ledger.host_staging == 0 and guard.staging_count == 0, guard.staging_sites
    assert ledger.readback_bytes["token_id"] == 4 * len(result.tokens)
    assert guard.readback_bytes["token_id"] == ledger.readback_bytes["token_id"]
    assert guard.readback_count["token_id"] == ledger.readback_count["token_id"] == len(result.tokens)
    assert ledger.readback_bytes["accept_count"] == 0
    return result


def accept_case(rng, width: int, cols: int):
    """A verification to accept: ``width + 1`` float32 rows of ``cols`` (small integers, so
    ties, and NaN planted), and ``width`` drafts equal to the rows' argmaxes up to a random
    point and wrong after it: ``(rows, drafts, agreed)``."""
    import numpy as np

    from engines.ledger import Ledger
    from engines.tensor_ops.host import HostTensorOps

    rows = rng.integers(-4, 5, size=(width + 1, cols)).astype(np.float32)
    rows[rng.random(rows.shape) < 0.05] = np.nan
    best = HostTensorOps(Ledger()).argmax_rows(rows, width + 1)
    agreed = int(rng.integers(0, width + 1))
    drafts = [int(b) for b in best[:agreed]] + [int((b + 1) % cols) for b in best[agreed:width]]
    return rows, drafts, agreed


def kernel_folder(tmp_path, plant: tuple[str, str, str] | None = None, extra=()) -> Path:
    """A copy of native-cuda's kernel folder under ``tmp_path`` for a test's own module:
    with ``plant`` (file, old, new) one bug planted (``old`` must be in the file once), and
    ``extra`` files of ``suites/kernels`` beside the kernels (they include the prelude)."""
    import shutil

    from engines.native.kernel_source import KERNELS

    folder = Path(tmp_path) / "kernels"
    shutil.copytree(KERNELS, folder, dirs_exist_ok=True)
    for name in extra:
        shutil.copy(Path(__file__).resolve().parent / "kernels" / name, folder / name)
    if plant is not None:
        file, old, new = plant
        text = (folder / file).read_text()
        assert text.count(old) == 1, f"the planted text is not in {file} once"
        (folder / file).write_text(text.replace(old, new))
    return folder
