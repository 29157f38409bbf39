"""The CUDA modules on the host (``engines/cuda_module.py``): a ``.cu`` file's text with its
headers expanded once each, the launcher's sizes as ``-D`` options, the instances it names
compiled and loaded once per device (CuPy stood in for), every kernel file of the tree
belonging to a module; and ``scripts/kernel_ptx_compare.py``'s reading of PTX."""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from engines.cuda_module import CudaModule
from engines.errors import ExecutionError
from engines.native.kernel_catalog import cuda_modules
from engines.native.kernel_source import instance, instance_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import kernel_ptx_compare as ptx_compare  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_text_expands_each_header_once_in_place(tmp_path):
    (tmp_path / "a.cuh").write_text("#pragma once\nint a;\n")
    (tmp_path / "b.cuh").write_text('#pragma once\n#include "a.cuh"\nint b;\n')
    (tmp_path / "k.cu").write_text('#include "a.cuh"\n#include "b.cuh"  // b needs a\nint k;\n')
    module = CudaModule(tmp_path, "k.cu", ("k",), (("LK_SIZE", 8),), ("--fmad=false",))
    assert module.text() == "int a;\nint b;\nint k;\n"
    assert module.compile_options() == ("--fmad=false", "-DLK_SIZE=8")


def test_instantiation_takes_every_instance_s_address():
    module = CudaModule(Path("."), "k.cu", ("k<float>", "k<lk_half>", "plain"))
    table = module.instantiation()
    assert all(f"(const void*)&{name}" in table for name in module.instances)


class _FakeCupy:
    """Records the modules CuPy would compile and the functions asked of them."""

    def __init__(self):
        self.compiled = []
        cupy = self

        class RawModule:
            def __init__(self, code, options, name_expressions):
                cupy.compiled.append((code, options, tuple(name_expressions)))

            def get_function(self, name):
                return f"function {name}"

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(Device=lambda device_id: _Nothing())


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_module_is_compiled_once_per_device_with_its_instances(monkeypatch, tmp_path):
    from engines import cuda_module

    fake = _FakeCupy()
    monkeypatch.setattr(cuda_module, "import_cupy", lambda: fake)
    monkeypatch.setattr(cuda_module, "_LOADED", {})
    (tmp_path / "k.cu").write_text("kernel text\n")
    module = CudaModule(tmp_path, "k.cu", ("k<float>", "k<int>"), (("LK_N", 4),))
    first = module.load(0)
    assert module.load(0) is first and len(fake.compiled) == 1
    assert fake.compiled[0] == ("kernel text\n", ("-DLK_N=4",), ("k<float>", "k<int>"))
    assert first == {"k<float>": "function k<float>", "k<int>": "function k<int>"}
    module.load(1)
    assert len(fake.compiled) == 2


def test_every_kernel_file_belongs_to_a_module():
    """Each .cu file of a kernels folder is some module's file, and each header is included
    by one, directly or through another header: nothing there that no launcher compiles."""
    read = set()

    def visit(folder: Path, name: str) -> None:
        if (folder, name) not in read:
            read.add((folder, name))
            for header in re.findall(r'^#include "([\w.]+)"', (folder / name).read_text(),
                                     re.MULTILINE):
                visit(folder, header)

    for module in cuda_modules().values():
        visit(module.folder, module.file)
    for folder in (ROOT / "engines" / "native" / "kernels",
                   ROOT / "engines" / "tensor_ops" / "kernels"):
        on_disk = {(folder, p.name) for p in [*folder.glob("*.cu"), *folder.glob("*.cuh")]}
        assert on_disk and on_disk <= read, sorted(p for _, p in on_disk - read)


def test_instance_names_a_template_by_its_storage_types():
    assert instance("attention", "float16", "float32") == "attention<lk_half, float>"
    assert instance_for("bmm", "int64", ("int64",)) == "bmm<long long>"
    with pytest.raises(ExecutionError) as info:
        instance_for("gemv_rows", "float64", ("float32", "float16"))
    assert info.value.field == "dtype" and info.value.value == "float64"
    assert "float32, float16" in info.value.remedy


# -- scripts/kernel_ptx_compare.py -------------------------------------------------------------
OLD_PTX = """
.extern .shared .align 16 .b8 lk_tile_smem[];

.visible .entry gemv_tile_f32(
\t.param .u64 gemv_tile_f32_param_0
)
{
\t.shared .align 4 .b8 _ZZ13gemv_tile_f32E4part[2048];
\tld.param.u64 \t%rd1, [gemv_tile_f32_param_0];
\tmov.u64 \t%rd2, lk_tile_smem;
$L__BB0_2:
\tadd.s64 \t%rd3, %rd1, 4;
\t@%p1 bra \t$L__BB0_2;
}
"""
NEW_PTX = OLD_PTX.replace("gemv_tile_f32_param", "_Z9gemv_tileIfEvPKT__param").replace(
    "gemv_tile_f32(", "_Z9gemv_tileIfEvPKT_(").replace(
    "_ZZ13gemv_tile_f32E4part", "_ZZ9gemv_tileIfEvPKT_E4part").replace("$L__BB0_", "$L__BB3_")


def _normalised(ptx: str) -> str:
    (name, (_linkage, body)), = ptx_compare.entries(ptx).items()
    return ptx_compare.normalised(name, body, ptx_compare.declarations(ptx))


def test_the_comparison_sees_only_names_change_as_identical():
    assert ptx_compare.declarations(OLD_PTX) == {
        "lk_tile_smem": ".extern .shared .align 16 .b8 lk_tile_smem[];"}
    old, new = _normalised(OLD_PTX), _normalised(NEW_PTX)
    assert "local.part" in old and "lk_tile_smem[]" in old and "ENTRY_param_0" in old
    assert old == new


def test_the_comparison_names_a_changed_instruction():
    changed = NEW_PTX.replace("add.s64 \t%rd3, %rd1, 4", "add.s64 \t%rd3, %rd1, 8")
    old, new = _normalised(OLD_PTX), _normalised(changed)
    assert old != new
    assert "%rd1, 8" in ptx_compare.first_difference(old, new)


def test_each_old_kernel_name_becomes_its_launcher_s_instance():
    assert ptx_compare.new_instance("fused_kernels", "rotary_kv_attention_f16_f32_f16") == \
        "rotary_kv_attention<lk_half, float, lk_half>"
    assert ptx_compare.new_instance("cuda_kernels", "kv_write2v_bf16") == "kv_write2v<lk_bf16>"
    assert ptx_compare.new_instance("cuda_kernels", "bmm_i64") == "bmm<long long>"
    assert ptx_compare.new_instance("argmax_bool", "lockstep_keys") == \
        "lockstep_keys<lk_argmax_bool>"
    # the accept was rewritten after the move: its successor's instance, named, not compared
    successor, _ = ptx_compare.REWRITTEN["lockstep_accept"]
    assert ptx_compare.new_instance("argmax_bool", successor) == \
        "lockstep_accept_rows<lk_argmax_bool>"
    assert ptx_compare.new_instance("casts", "lk_f32_to_bf16") == "lk_cast<float, lk_bf16>"
