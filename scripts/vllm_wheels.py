"""vLLM's wheels for the H200 image, which reaches no registry (issue 35 item 5).

pip's resolver works out vllm's whole dependency closure for CPython 3.12 on manylinux
x86_64 in a scratch virtual environment where the packages the image already has (torch
2.11.0+cu130 and what it brings, transformers and its needs, numpy, onnx) are installed as
metadata only, so pip keeps them instead of demanding them. Of the rest, the packages text-only
greedy decoding never imports (vLLM imports each of them lazily, behind a guard or inside the
model or kernel that needs it) are left out: they are most of the closure's size (about 650 MB
of 800). Every other wheel is downloaded and checked against the hash pip's report gives.
A second resolve, offline against the downloaded folder alone and with the left-out packages
installed as metadata too, proves the folder complete: it must want nothing but the wheels
there. The device installs the folder with ``pip install --no-index --no-deps --target``.

Usage: python3 scripts/vllm_wheels.py --vllm WHEEL_OR_SPEC --out DIR [--python python3.12]
Writes DIR/*.whl and DIR/closure.txt (every package of the closure: shipped, on the image or
left out, with the reason).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

PLATFORMS = ["manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "any"]

# On the H200 image (shared/GPU_MACHINE.md): torch 2.11.0+cu130 with its pinned CUDA wheels and
# triton, transformers 5.17 with its needs, numpy 2.5, onnx, pillow (matplotlib's). The
# versions are the lowest each requirer accepts where the image's exact one is unknown.
IMAGE = {
    "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda-toolkit": "13.0.2",
    "cuda-bindings": "13.0.3", "cuda-pathfinder": "1.1.0", "nvidia-cudnn-cu13": "9.19.0.56",
    "nvidia-cusparselt-cu13": "0.8.0", "nvidia-nccl-cu13": "2.28.9",
    "nvidia-nvshmem-cu13": "3.4.5", "transformers": "5.17.0", "tokenizers": "0.23.1",
    "safetensors": "0.8.0", "huggingface-hub": "1.5.0", "numpy": "2.5.0", "onnx": "1.23.0",
    "pyyaml": "6.0.3", "regex": "2025.11.3", "tqdm": "4.67.1", "packaging": "25.0",
    "requests": "2.32.5", "sympy": "1.14.0", "networkx": "3.5", "jinja2": "3.1.6",
    "markupsafe": "3.0.3", "fsspec": "2025.10.0", "filelock": "3.20.0", "pillow": "12.0.0",
    "ml-dtypes": "0.5.3",
}

_MEDIA = "multimodal (image, audio, video) input only"
_CUTE = "CuTe DSL kernels (DeepSeek, Mamba, FA4 on Blackwell); vLLM checks `import cutlass` first"
_TILE = "DeepSeek-V4 / MLA kernels only"
_HUMMING = "humming's quantized kernels and the CUDA 13.5 toolchain they pull in"
_FLASHINFER = ("FlashInfer attention and sampling; on the H200 vLLM picks its bundled "
               "flash-attention, and greedy sampling needs no FlashInfer")
LEFT_OUT = {
    "opencv-python-headless": _MEDIA, "torchvision": _MEDIA, "torchaudio": _MEDIA,
    "torchcodec": _MEDIA, "pynvvideocodec": _MEDIA,
    "tilelang": _TILE, "z3-solver": _TILE, "torch-c-dlpack-ext": _TILE,
    "tokenspeed-mla": _TILE, "tokenspeed-triton": _TILE,
    "quack-kernels": _CUTE, "nvidia-cutlass-dsl": _CUTE, "nvidia-cutlass-dsl-libs-base": _CUTE,
    "nvidia-cutlass-dsl-libs-core": _CUTE, "nvidia-cutlass-dsl-libs-cu12": _CUTE,
    "nvidia-cutlass-dsl-libs-cu13": _CUTE, "cuda-python": _CUTE, "cuda-core": _CUTE,
    "cuda-bindings": "the image's (torch's) cuda-bindings 13.0 stays", "cuda-pathfinder": _CUTE,
    "cuda-tile": _FLASHINFER, "nvidia-cuda-nvdisasm": _CUTE,
    "humming-kernels": _HUMMING, "nvidia-cuda-nvcc": _HUMMING, "nvidia-cuda-crt": _HUMMING,
    "nvidia-nvvm": _HUMMING, "nvidia-cuda-runtime": _HUMMING, "nvidia-cuda-nvrtc": _HUMMING,
    "nvidia-cuda-cccl": _HUMMING, "nvidia-ml-py": _HUMMING + " (vLLM vendors pynvml)",
    "pyelftools": _HUMMING, "tabulate": _HUMMING,
    "flashinfer-python": _FLASHINFER, "nvidia-cudnn-frontend": _FLASHINFER,
    "numba": "n-gram speculative decoding only", "llvmlite": "numba's",
    "numpy": "numba's pin (<2.5); the image's numpy 2.5 stays",
    "grpcio": "OpenTelemetry export over gRPC (tracing) only",
    "opentelemetry-exporter-otlp-proto-grpc": "OpenTelemetry export over gRPC (tracing) only",
}


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def scratch_env(root: Path, python: str, fakes: dict[str, str]) -> Path:
    """A virtual environment with a current pip and ``fakes`` installed as metadata only."""
    subprocess.run([python, "-m", "venv", str(root)], check=True)
    pip = [str(root / "bin" / "python"), "-m", "pip"]
    subprocess.run(pip + ["install", "-q", "--upgrade", "pip"], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    for name, version in fakes.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("lockstep-metadata-only\n")
        (info / "RECORD").write_text("")
    return root / "bin" / "python"


def dry_run(python: Path, report: Path, args: list[str]) -> list[dict]:
    """pip's resolve of ``args`` (no install): the report's ``install`` entries."""
    env = dict(os.environ, PIP_CONSTRAINT="", PIP_FIND_LINKS="")
    platform = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
           "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
           *platform, *args]
    subprocess.run(cmd, check=True, env=env)
    return json.loads(report.read_text())["install"]


def fetch(item: dict, out: Path) -> Path:
    """The wheel of one report entry in ``out``, its sha256 checked against the report's."""
    url = item["download_info"]["url"]
    dest = out / url.rsplit("/", 1)[-1].split("#")[0]
    want = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
    if not dest.exists():
        if url.startswith("file://"):
            dest.write_bytes(Path(url[len("file://"):]).read_bytes())
        else:
            with urllib.request.urlopen(url) as response, open(dest, "wb") as f:
                while chunk := response.read(1 << 20):
                    f.write(chunk)
    if want and hashlib.sha256(dest.read_bytes()).hexdigest() != want:
        dest.unlink()
        sys.exit(f"{dest.name}: sha256 differs from pip's report; fetch it again")
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", default="vllm==0.26.0", help="a vllm wheel or requirement")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--python", default="python3.12", help="a CPython 3.12 for the venvs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        resolver = scratch_env(tmp / "resolve", args.python, IMAGE)
        closure = dry_run(resolver, tmp / "closure.json", [args.vllm])
        lines, shipped = [], []
        for item in closure:
            name, version = item["metadata"]["name"], item["metadata"]["version"]
            key = canonical(name)
            if key in LEFT_OUT:
                lines.append(f"left out  {name}=={version}: {LEFT_OUT[key]}")
                continue
            wheel = fetch(item, args.out)
            shipped.append((name, version))
            lines.append(f"shipped   {name}=={version} ({wheel.stat().st_size / 1e6:.1f} MB)")
        lines += [f"on image  {name}=={version}" for name, version in IMAGE.items()]
        # the folder is complete: offline, with the image's and the left-out packages
        # installed as metadata, the resolve wants exactly the shipped wheels
        left = {item["metadata"]["name"]: item["metadata"]["version"] for item in closure
                if canonical(item["metadata"]["name"]) in LEFT_OUT}
        checker = scratch_env(tmp / "check", args.python, {**IMAGE, **left})
        spec = "vllm==" + next(v for n, v in shipped if canonical(n) == "vllm")
        wanted = dry_run(checker, tmp / "check.json",
                         ["--no-index", "--find-links", str(args.out), spec])
        want = {(canonical(i["metadata"]["name"]), i["metadata"]["version"]) for i in wanted}
        have = {(canonical(n), v) for n, v in shipped}
        if want != have:
            sys.exit(f"the offline resolve differs from the folder: wants {sorted(want - have)}, "
                     f"leaves {sorted(have - want)}")
    total = sum(p.stat().st_size for p in args.out.glob("*.whl"))
    lines.append(f"{len(shipped)} wheels shipped, {total / 1e6:.1f} MB; the offline resolve "
                 "against them alone wants exactly these")
    (args.out / "closure.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-1:]))


if __name__ == "__main__":
    main()
