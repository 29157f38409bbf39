"""``llama-server`` built from the very llama.cpp source the ``llama-cpp`` engine runs, once,
and cached like a conversion.

llama-cpp-python's sdist vendors the whole llama.cpp tree (``vendor/llama.cpp``, its server
included), so the server lockstep starts and the in-process engine compute with the same
ggml at the same commit. The sdist is fetched with pip (the pinned version,
``LLAMA_CPP_PYTHON``), unpacked, and cmake builds the one target ``llama-server``, statically
linked, with the CPU backend for this machine (``-march=native``, as pip builds the
in-process library), no web UI, no downloads, no TLS. About 10 minutes on 2 cores; ``make
test``'s set-up runs it (``make llama-server``), and a second run finds the binary cached:

    <cache>/llama-server/<version>-<key>/llama-server   the binary
    <cache>/llama-server/<version>-<key>/build.json     what made it (version, sdist hash,
                                                        cmake options, ggml version, seconds)

``key`` hashes the version and the cmake options, nothing else, so editing lockstep does not
rebuild it. ``$LOCKSTEP_LLAMA_SERVER`` names a binary of the user's own instead (recorded as
such). ``python -m engines.backends.http.server_build`` builds (or finds) it and prints its
path; ``-j N`` sets the build's jobs (default: every core).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from engines.backends.llama_cpp import VERSION
from engines.cache_root import cache_root
from engines.errors import EngineUnavailable, ExecutionError, InputError, LockstepError

#: llama-cpp-python, the version the ``llama-cpp`` engine pins (pyproject's ``llama`` extra)
LLAMA_CPP_PYTHON = VERSION
BINARY_ENV = "LOCKSTEP_LLAMA_SERVER"
BUILD_FILE = "build.json"
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
                 "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF")
#: how a program the OS can start begins: ELF, Mach-O (32/64-bit, either byte order, fat), #!
PROGRAM_MAGIC = (b"\x7fELF", b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe",
                 b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe", b"#!")
HOW = ("make llama-server (python -m engines.backends.http.server_build: llama.cpp's server "
       "from llama-cpp-python's sdist, about 10 minutes on 2 cores, once)")


@dataclass(frozen=True)
class ServerBuild:
    """A llama-server binary and what made it (``build.json``, or the user's own binary)."""
    binary: Path
    record: dict

    def to_dict(self) -> dict:
        return {"binary": str(self.binary), **self.record}


def build_key(version: str = LLAMA_CPP_PYTHON) -> str:
    text = json.dumps({"llama-cpp-python": version, "cmake": list(CMAKE_OPTIONS)})
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_folder() -> Path:
    """``<cache>/llama-server``, symlinks resolved: cmake's tree records absolute paths, and
    one build reached by two spellings of its path would be rebuilt whole."""
    return (cache_root() / "llama-server").resolve()


def build_folder(version: str = LLAMA_CPP_PYTHON) -> Path:
    return cache_folder() / f"{version}-{build_key(version)}"


def find_server() -> ServerBuild | None:
    """``$LOCKSTEP_LLAMA_SERVER`` where set (it must be an executable program: a file marked
    executable that is a compiled binary or a ``#!`` script, so a text file fails here, not
    as an exec error when the first cell starts it), else the cached build of the pinned
    version; None where neither exists."""
    given = os.environ.get(BINARY_ENV, "").strip()
    if given:
        path = Path(given).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            why = "not an executable file"
        elif not _starts_as_program(path):
            why = "not a program (neither a compiled binary nor a #! script)"
        else:
            return ServerBuild(path, {"source": f"${BINARY_ENV}", "built_by": "the user"})
        raise InputError(why, field=BINARY_ENV, value=given,
                         remedy=f"point {BINARY_ENV} at a llama-server binary, or unset it to "
                                f"use the one {HOW.split(' (')[0]} builds")
    folder = build_folder()
    binary, record = folder / "llama-server", folder / BUILD_FILE
    if binary.is_file() and record.is_file():
        try:
            return ServerBuild(binary, json.loads(record.read_text()))
        except ValueError:
            return None
    return None


def _starts_as_program(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return False
    return head.startswith(PROGRAM_MAGIC)


def require_server() -> ServerBuild:
    found = find_server()
    if found is None:
        raise EngineUnavailable(f"llama-server {LLAMA_CPP_PYTHON} is not built here "
                                f"(looked in {build_folder()})", field="llama-server",
                                value=str(build_folder()), remedy=HOW)
    return found


def _run(argv: list[str], log: Path, cwd: Path | None = None) -> None:
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-8:]
        raise ExecutionError(f"{argv[0]} failed (exit {proc.returncode}): " + " | ".join(tail),
                             field="llama-server build", value=" ".join(argv[:3]),
                             remedy=f"see {log}; the build needs cmake and a C++17 compiler")


def _sdist(work: Path, log: Path) -> Path:
    """llama-cpp-python's sdist, fetched by pip into ``work`` (reused when there)."""
    found = sorted(work.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))
    if found:
        return found[0]
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(work)], log)
    return work / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def server_version(binary: Path) -> str:
    """``llama-server --version`` (its build number, commit and compiler), one line."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (out.stdout + out.stderr).strip().splitlines()
    return " ".join(line.strip() for line in text if "version" in line or "built" in line) \
        or "unknown"


def ensure_server(jobs: int | None = None) -> ServerBuild:
    """The cached llama-server of the pinned version, built on first use. The work folder
    (source and cmake tree) is kept until the build succeeds, so an interrupted build
    resumes where it stopped, and removed after."""
    found = find_server()
    if found is not None:
        return found
    folder = build_folder()
    work = cache_folder() / f"work-{LLAMA_CPP_PYTHON}"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "build.log"
    start = time.perf_counter()
    sdist = _sdist(work, log)
    src = work / "src"
    if not (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        shutil.rmtree(src, ignore_errors=True)
        staged = work / ".unpack"
        shutil.rmtree(staged, ignore_errors=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(staged, filter="data")
        (staged / f"llama_cpp_python-{LLAMA_CPP_PYTHON}").rename(src)
        shutil.rmtree(staged, ignore_errors=True)
    cmake_tree = work / "build"
    _run(["cmake", "-S", str(src / "vendor" / "llama.cpp"), "-B", str(cmake_tree),
          *CMAKE_OPTIONS], log)
    _run(["cmake", "--build", str(cmake_tree), "--target", "llama-server", "-j",
          str(jobs or os.cpu_count() or 2)], log)
    built = cmake_tree / "bin" / "llama-server"
    staged = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    shutil.copy2(built, staged / "llama-server")
    record = {"llama_cpp_python": LLAMA_CPP_PYTHON, "sdist": sdist.name,
              "sdist_sha256": _sha256(sdist), "source": "vendor/llama.cpp of the sdist",
              "cmake_options": list(CMAKE_OPTIONS), "key": build_key(),
              "version": server_version(staged / "llama-server"),
              "build_seconds": round(time.perf_counter() - start, 1)}
    (staged / BUILD_FILE).write_text(json.dumps(record, indent=2) + "\n")
    (staged / "build.log").write_bytes(log.read_bytes())
    shutil.rmtree(folder, ignore_errors=True)
    staged.rename(folder)
    shutil.rmtree(work, ignore_errors=True)
    return ServerBuild(folder / "llama-server", record)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engines.backends.http.server_build",
                                     description="build (or find) llama-server")
    parser.add_argument("-j", "--jobs", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        build = ensure_server(args.jobs)
    except (LockstepError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(build.binary)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["BINARY_ENV", "CMAKE_OPTIONS", "LLAMA_CPP_PYTHON", "PROGRAM_MAGIC", "ServerBuild",
           "build_folder", "build_key", "ensure_server", "find_server", "require_server",
           "server_version"]
