"""The matrix across every GPU of a host, on pytest-xdist (``lockstep run --devices``), tested
on the CPU: GPU pinning of xdist workers, ``--devices`` validation, a distributed run over host
engines with a fake GPU list that records what the in-process run records, cell for cell, a
worker that dies in a cell, the GPU fields of the evidence, and the report's "differs between
GPUs" flag."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engines.errors import InputError
from harness import distributed as dist
from harness import evidence as ev
from harness.cli import main
from harness.evidence.environment import format_gpu_uuid, gpu_index_of
from harness.manifest import read_manifests
from reports import render_report
from reports.render import gpu_differences
from suites.test_report import finding, make_record, parse

pytestmark = pytest.mark.claim("token_identity")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps the tables to the terminal's width


# -- pinning a worker to its GPU -----------------------------------------------------------------

def test_worker_gw1_is_pinned_to_the_second_gpu_of_the_list():
    env = {"LOCKSTEP_GPUS": "0,1", "PYTEST_XDIST_WORKER": "gw1"}
    assert dist.pin_worker_gpu(env) == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["LOCKSTEP_GPU"] == "1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # indices as nvidia-smi numbers them
    env0 = {"LOCKSTEP_GPUS": "0,1", "PYTEST_XDIST_WORKER": "gw0"}
    assert dist.pin_worker_gpu(env0) == "0" and env0["CUDA_VISIBLE_DEVICES"] == "0"
    uuids = {"LOCKSTEP_GPUS": "GPU-aa,GPU-bb", "PYTEST_XDIST_WORKER": "gw1"}
    assert dist.pin_worker_gpu(uuids) == "GPU-bb" and uuids["CUDA_VISIBLE_DEVICES"] == "GPU-bb"


def test_pinning_leaves_everything_alone_without_a_gpu_list_or_on_the_controller():
    assert dist.pin_worker_gpu({"PYTEST_XDIST_WORKER": "gw1"}) is None
    controller = {"LOCKSTEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert dist.pin_worker_gpu(controller) is None
    assert controller == {"LOCKSTEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    one = {"LOCKSTEP_GPUS": "3"}  # one GPU: pinned without xdist too
    assert dist.pin_worker_gpu(one) == "3" and one["CUDA_VISIBLE_DEVICES"] == "3"


def test_a_process_started_by_a_pinned_worker_keeps_its_pin():
    env = {"LOCKSTEP_GPUS": "0,1", "PYTEST_XDIST_WORKER": "gw1",
           "PYTEST_XDIST_TESTRUNUID": "r1"}
    env = {**env, "LOCKSTEP_GPU": "1", "LOCKSTEP_GPU_PINNED": "r1:gw1",
           "CUDA_VISIBLE_DEVICES": "1"}
    assert dist.pin_worker_gpu(env) == "1" and env["CUDA_VISIBLE_DEVICES"] == "1"


def test_more_workers_than_gpus_is_an_error_naming_the_remedy():
    with pytest.raises(RuntimeError, match="-n 2 or fewer"):
        dist.pin_worker_gpu({"LOCKSTEP_GPUS": "0,1", "PYTEST_XDIST_WORKER": "gw2"})


def test_a_replacement_worker_takes_the_gpu_its_dead_predecessor_freed(tmp_path):
    run = {"LOCKSTEP_GPUS": "0,1", "PYTEST_XDIST_TESTRUNUID": "run1",
           "LOCKSTEP_GPU_LOCKS": str(tmp_path)}
    try:
        assert dist.pin_worker_gpu({**run, "PYTEST_XDIST_WORKER": "gw0"}) == "0"  # held here
        # gw1 claims GPU 1 in its own process, then dies: its lock goes with it
        child = subprocess.run(
            [sys.executable, "-c", "import os; from harness.distributed import pin_worker_gpu;"
                                   "print(pin_worker_gpu(os.environ))"],
            env={**run, "PYTEST_XDIST_WORKER": "gw1", "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, cwd=ROOT, check=True)
        assert child.stdout.strip() == "1"
        gw2 = {**run, "PYTEST_XDIST_WORKER": "gw2"}  # xdist's name for gw1's replacement
        assert dist.pin_worker_gpu(gw2) == "1" and gw2["CUDA_VISIBLE_DEVICES"] == "1"
        with pytest.raises(RuntimeError, match="held by another worker"):
            dist.pin_worker_gpu({**run, "PYTEST_XDIST_WORKER": "gw3"})
    finally:
        dist.release_gpu_locks()


# -- which GPUs, and --devices -------------------------------------------------------------------

def test_visible_gpus_follow_cuda_visible_devices_and_the_count_override():
    assert dist.visible_gpus({}, count=lambda: 2) == ["0", "1"]
    assert dist.visible_gpus({}, count=lambda: 0) == []
    assert dist.visible_gpus({"CUDA_VISIBLE_DEVICES": "4,6"}, count=lambda: 2) == ["4", "6"]
    assert dist.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, count=lambda: 0) == []
    assert dist.visible_gpus({"LOCKSTEP_GPU_COUNT": "3"}, count=lambda: 0) == ["0", "1", "2"]
    with pytest.raises(InputError) as err:
        dist.visible_gpus({"LOCKSTEP_GPU_COUNT": "two"})
    assert err.value.field == "LOCKSTEP_GPU_COUNT"


def test_devices_parse_to_the_chosen_gpus():
    assert dist.parse_devices("all", ["0", "1"]) == ["0", "1"]
    assert dist.parse_devices("1", ["0", "1"]) == ["1"]
    assert dist.parse_devices("1,0", ["4", "6"]) == ["6", "4"]
    assert dist.parse_devices(" 0 , 1 ", ["0", "1"]) == ["0", "1"]


@pytest.mark.parametrize("text,visible,says", [
    ("", ["0", "1"], "names no GPU"),
    ("  ", ["0", "1"], "names no GPU"),
    ("x", ["0", "1"], "'x' is not a GPU index"),
    ("-1", ["0", "1"], "'-1' is not a GPU index"),
    ("0,", ["0", "1"], "'' is not a GPU index"),
    ("2", ["0", "1"], "GPU 2 is not visible: 2 GPU(s) visible here"),
    ("0,1,2", ["0", "1"], "3 GPUs asked for, but 2 GPU(s) visible here"),
    ("0,0", ["0", "1"], "GPU 0 is named twice"),
    ("all", [], "no GPU is visible here"),
    ("0", [], "1 GPUs asked for, but 0 GPU(s) visible here"),
])
def test_bad_devices_are_input_errors_naming_the_field_and_the_remedy(text, visible, says):
    with pytest.raises(InputError) as err:
        dist.parse_devices(text, visible)
    assert says in err.value.message
    assert err.value.field == "--devices" and err.value.remedy


def test_the_cli_refuses_bad_devices_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_GPU_COUNT", "2")
    ev_dir = tmp_path / "ev"
    status = main(["run", "--engines", "native-host", "--packages", "tiny_llama",
                   "--devices", "2", "--evidence-dir", str(ev_dir)])
    err = capsys.readouterr().err
    assert status == 2
    assert "GPU 2 is not visible" in err and "[field --devices = '2']" in err
    assert "remedy: use indices below 2, or --devices all" in err
    assert not ev_dir.exists() or not any(ev_dir.iterdir())


# -- the evidence names its GPU --------------------------------------------------------------------

def test_gpu_uuids_are_formatted_as_nvidia_smi_prints_them():
    raw = bytes(range(16))
    assert format_gpu_uuid(raw) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert format_gpu_uuid(raw + b"\x01\x02") == format_gpu_uuid(raw)  # read past the array
    assert format_gpu_uuid(raw[:7]) is None  # cut at a zero byte: no identity
    assert format_gpu_uuid("GPU-5f1c2b1e-8a3b-11ee-9c2d-0242ac120002").startswith("GPU-5f1c")
    assert format_gpu_uuid("5f1c2b1e8a3b11ee9c2d0242ac120002") == \
        "GPU-5f1c2b1e-8a3b-11ee-9c2d-0242ac120002"
    assert format_gpu_uuid(None) is None and format_gpu_uuid("junk") is None


def test_gpu_index_is_the_physical_index_behind_the_cuda_device():
    assert gpu_index_of(0, {}) == 0
    assert gpu_index_of(1, {}) == 1
    assert gpu_index_of(0, {"CUDA_VISIBLE_DEVICES": "3"}) == 3
    assert gpu_index_of(1, {"CUDA_VISIBLE_DEVICES": "2,5"}) == 5
    assert gpu_index_of(0, {"CUDA_VISIBLE_DEVICES": "GPU-5f1c2b1e"}) is None


def test_a_pinned_process_records_its_gpu_even_without_cuda(monkeypatch):
    monkeypatch.setenv("LOCKSTEP_GPU", "1")
    env = ev.collect_environment()
    assert env.gpu_index == 1
    assert set(ev.Environment.model_fields) >= {"gpu_index", "gpu_uuid", "gpu_name"}
    old = {"host": "h", "platform": "p", "python": "3.11"}  # a record from before: still reads
    assert ev.Environment.model_validate(old).gpu_uuid is None


# -- a distributed run records what the in-process run records -------------------------------------

VOLATILE = {"run_id", "created", "environment", "timings", "ok"}


def _normalized(record) -> dict:
    data = json.loads(record.model_dump_json())
    for key in VOLATILE:
        data.pop(key, None)
    data["ledger"].pop("phase_seconds", None)
    if data.get("error"):
        # where the exception was caught differs (run_matrix's loop or CellRunner); what and
        # why must not
        assert data["error"]["traceback"]
        data["error"].pop("traceback")
    return data


def _by_cell(folder: Path) -> dict:
    return {(r.package.name, r.engine, r.mode.label, r.prompt.name): r
            for r in ev.load_evidence_dir(folder)}


def _table(out: str) -> str:
    """What the CLI prints up to the evidence line (the table and the findings)."""
    return out.split("evidence:")[0]


def _both(args: list[str], tmp_path, capsys, monkeypatch):
    one, two = tmp_path / "in-process", tmp_path / "devices"
    status_one = main(["run", *args, "--evidence-dir", str(one)])
    out_one = capsys.readouterr().out
    monkeypatch.setenv("LOCKSTEP_GPU_COUNT", "2")
    status_two = main(["run", *args, "--devices", "all", "--evidence-dir", str(two)])
    out_two = capsys.readouterr().out
    return (status_one, out_one, one), (status_two, out_two, two)


def _same_records(one: Path, two: Path) -> dict:
    a, b = _by_cell(one), _by_cell(two)
    assert list(a) and set(a) == set(b)
    for key in a:
        assert _normalized(a[key]) == _normalized(b[key]), key
    (m1,), (m2,) = read_manifests(one), read_manifests(two)
    assert m2.complete and [c.key for c in m1.planned] == [c.key for c in m2.planned]
    assert len(b) == len(m2.planned)
    return b


def test_a_distributed_greedy_run_records_what_the_in_process_run_records(
        tmp_path, capsys, monkeypatch):
    args = ["--engines", "native-host,suites.planted.engines:RaiseMidDecode,"
                         "suites.planted.engines:ConstructorFails,"
                         "suites.planted.engines:TokenSwap,suites.distributed_engines:NotHere",
            "--packages", "tiny_llama,lookup_chained", "--max-new-tokens", "8"]
    (s1, out1, one), (s2, out2, two) = _both(args, tmp_path, capsys, monkeypatch)
    assert s1 == s2 == 1
    assert _table(out1) == _table(out2)
    assert "devices: 2 GPU(s) (0,1), one pytest-xdist worker pinned to each" in out2
    records = _same_records(one, two)
    statuses = {r.status for r in records.values()}
    assert statuses == {"identical", "error", "defect"}
    # the engine that cannot run here is left out of both runs alike, and said so
    (m1,), (m2,) = read_manifests(one), read_manifests(two)
    assert m1.left_out == m2.left_out and {lo.engine for lo in m1.left_out} == \
        {"distributed-not-here"}
    assert "distributed-not-here: 6 cell(s) on 2 package(s) not run: not available here" in out2
    # every record names the GPU its worker was pinned to; each worker took one package
    gpus = {r.package.name: {r2.environment.gpu_index for r2 in records.values()
                             if r2.package.name == r.package.name} for r in records.values()}
    assert all(len(g) == 1 for g in gpus.values()) and set().union(*gpus.values()) == {0, 1}
    log = next((two / "runs").glob("*-pytest.log")).read_text()
    assert "passed" in log and "failed" in log


def test_a_distributed_speculative_run_records_what_the_in_process_run_records(
        tmp_path, capsys, monkeypatch):
    """Speculative cells on the workers as in process, and the oracle moved to another engine
    in recompute mode: the controller vets it, and its engine, mode and check reach every
    worker's records."""
    args = ["--mode", "speculative", "--width", "2", "--engines", "native-host,ort-cpu",
            "--packages", "lookup_chained,tiny_llama_pair", "--max-new-tokens", "8",
            "--oracle-engine", "native-host", "--oracle-mode", "recompute"]
    (s1, out1, one), (s2, out2, two) = _both(args, tmp_path, capsys, monkeypatch)
    assert s1 == s2 == 0
    assert _table(out1) == _table(out2) and "accepted" in out2
    records = _same_records(one, two)
    assert all(r.greedy is not None and r.status == "identical" for r in records.values())
    for record in records.values():
        j = record.judgement
        assert j.oracle == "oracle:native-host" and j.oracle_mode == "recompute"
        assert j.oracle_check is not None and j.oracle_check.against == "ort-cpu"


def test_a_cell_that_kills_its_worker_is_an_error_record_and_the_rest_runs_on(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_GPU_COUNT", "2")
    ev_dir = tmp_path / "ev"
    status = main(["run", "--engines", "native-host,suites.distributed_engines:DiesOnPrompt",
                   "--packages", "tiny_llama,lookup_chained", "--max-new-tokens", "6",
                   "--devices", "all", "--evidence-dir", str(ev_dir)])
    out = capsys.readouterr().out
    assert status == 1 and "WorkerCrashed" in out
    records = _by_cell(ev_dir)
    (manifest,) = read_manifests(ev_dir)
    assert manifest.complete and len(records) == len(manifest.planned) == 12
    dead = records[("tiny_llama", "distributed-dies", "greedy", "p1")]
    assert dead.status == "error" and dead.error.stage == "worker"
    assert dead.error.type == "WorkerCrashed" and "pytest-xdist worker gw" in dead.error.message
    assert "died while running it" in dead.error.message
    others = [r for key, r in records.items() if r is not dead]
    assert all(r.status == "identical" for r in others)
    # the cell after the crash ran on the replacement worker, on the GPU that was freed
    assert all(r.environment.gpu_index in (0, 1) for r in records.values())


# -- the report: the GPU per record, and cells that differ between GPUs --------------------------

def _on_gpu(record, index: int):
    env = record.environment.model_copy(update={
        "gpu_index": index, "gpu_name": "NVIDIA H200",
        "gpu_uuid": f"GPU-{index:08x}-0000-0000-0000-00000000000{index}"})
    return record.model_copy(update={"environment": env})


def _defect():
    return dict(status="defect", tokens=[5, 9, 66, 7, 30, 2], reference=[5, 9, 12, 7, 30, 2],
                findings=[finding(2, 66, 12)],
                divergence=ev.Divergence(step=2, reference_token=12, engine_token=66,
                                         verdict="defect", rank=4, gap=0.8))


def test_the_report_flags_a_cell_that_fails_on_one_gpu_and_passes_on_another():
    passing = _on_gpu(make_record(engine="native-cuda", run_id="one-gpu"), 0)
    failing = _on_gpu(make_record(engine="native-cuda", run_id="two-gpus", **_defect()), 1)
    both_fail = [_on_gpu(make_record(engine="ort-cuda", prompt="p1", run_id=r, **_defect()), i)
                 for r, i in (("one-gpu", 0), ("two-gpus", 1))]
    same_gpu = [_on_gpu(make_record(engine="ort-cuda", prompt="p2", run_id="one-gpu"), 0),
                _on_gpu(make_record(engine="ort-cuda", prompt="p2", run_id="two-gpus",
                                    **_defect()), 0)]
    records = [passing, failing, *both_fail, *same_gpu]
    (diff,) = gpu_differences(records)
    assert diff.cell == ("tiny_llama", "native-cuda", "greedy", "p0")
    assert diff.failing_on == ["GPU 1 · GPU-00000001"]
    assert diff.passing_on == ["GPU 0 · GPU-00000000"]

    dom = parse(render_report(records))
    box = dom.by_id("gpu-differs")
    rows = box.find_all("tr", **{"class": "gpu-differs"})
    assert [(tr.attrs["data-engine"], tr.attrs["data-prompt"]) for tr in rows] == \
        [("native-cuda", "p0")]
    assert rows[0].by_class("td", "failing-on")[0].text() == "GPU 1 · GPU-00000001"
    cells = {td.attrs["data-engine"]: td for td in dom.by_id("matrix").find_all("td")
             if "data-verdict" in td.attrs}
    assert cells["native-cuda"].attrs["data-differs-gpus"] == "yes"
    assert "differs between GPUs" in cells["native-cuda"].text()
    assert cells["ort-cuda"].attrs["data-differs-gpus"] == "no"
    summary = {d.attrs["data-key"]: d for d in dom.by_id("summary").find_all("div")
               if "data-key" in d.attrs}
    assert summary["differs-gpus"].find_all("b")[0].text() == "1"
    # the GPU of every record: a column of the claims table, and the GPUs section
    gpu_cells = [td.text() for td in dom.by_id("claims").find_all("td")
                 if "gpu" in (td.attrs.get("class") or "").split()]
    assert sorted(set(gpu_cells)) == ["GPU 0 · GPU-00000000", "GPU 1 · GPU-00000001"]
    gpus = dom.by_id("gpus-table").find_all("tr", **{"class": "gpu-row"})
    assert [tr.find_all("td")[0].text() for tr in gpus] == ["GPU 0", "GPU 1"]


def test_records_without_a_gpu_show_none_and_flag_nothing():
    dom = parse(render_report([make_record(), make_record(engine="ort-cpu", **_defect())]))
    assert not [n for n in dom.iter() if n.attrs.get("id") == "gpu-differs"]
    assert not [d for d in dom.by_id("summary").find_all("div")
                if d.attrs.get("data-key") == "differs-gpus"]
    gpu_cells = {td.text() for td in dom.by_id("claims").find_all("td")
                 if "gpu" in (td.attrs.get("class") or "").split()}
    assert gpu_cells == {"—"}
    assert not dom.by_id("gpus").find_all("table")


# -- the acceptance measurement's comparison -----------------------------------------------------

def test_the_timing_summary_compares_runs_cell_for_cell(tmp_path):
    from harness import gpu_timing

    one, two = tmp_path / "one", tmp_path / "two"
    for i, name in enumerate(("p0", "p1", "p2", "p3")):
        ev.write_evidence(_on_gpu(make_record(prompt=name, run_id="a"), 0), one)
        ev.write_evidence(_on_gpu(make_record(prompt=name, run_id="b"), i % 2), two)
    times = tmp_path / "times.txt"
    times.write_text("one greedy_ns=10000000000 speculative_ns=30000000000 greedy_exit=0 "
                     "speculative_exit=0\ntwo greedy_ns=6000000000 speculative_ns=16000000000 "
                     "greedy_exit=0 speculative_exit=0\n")
    util = tmp_path / "util.csv"
    util.write_text("".join(f"2026/12/01 00:00:0{s}.000, {g}, GPU-{g}, {30 + g}, 900\n"
                            for s in range(4) for g in (0, 1)))
    summary = gpu_timing.summarize(one, two, times, util_two=util)
    assert summary["wall_s"] == {"one": 40.0, "two": 22.0}
    assert summary["ratio"] == pytest.approx(0.55)
    assert summary["verdicts"]["identical"] and summary["verdicts"]["compared"] == 4
    assert [g["cells"] for g in summary["per_gpu_two"]] == [2, 2]
    assert [u["mean_util"] for u in summary["utilization_two"]] == [30.0, 31.0]
    assert summary["accepted"], summary["checks"]
    assert "ACCEPTED" in gpu_timing.render(summary)
    # a cell whose verdict differs between the runs fails the acceptance
    ev.write_evidence(_on_gpu(make_record(prompt="p4", run_id="a"), 0), one)
    ev.write_evidence(_on_gpu(make_record(prompt="p4", run_id="b", **_defect()), 1), two)
    summary = gpu_timing.summarize(one, two, times, util_two=util)
    assert not summary["accepted"]
    assert summary["verdicts"]["status_differs"] == [
        {"cell": "tiny_llama · native-host · greedy · p4", "one": "identical", "two": "defect"}]


def test_gpu_run_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_run.sh")]).returncode == 0
