"""Engine registry: the built-in engines plus third parties' through an entry point group.

A third-party package declares ``[project.entry-points."lockstep.engines"]
my-engine = "my_pkg.engine:MyEngine"`` and its class appears here by name. A class can also
be named directly as ``"package.module:ClassName"`` (``lockstep run --engines
my_pkg.engine:MyEngine``) without installing anything; its engine name is then the class's
own ``name``.

An engine's ``name`` is what its results are recorded under, so the registry refuses any
class that could write results under another engine's name: a class without a ``name`` of
its own (a subclass of ``OrtCpuEngine`` would otherwise report as ``ort-cpu``), a class
registered under a name other than its own, and anything that would replace a built-in
engine. A plugin that fails to import is reported with its error when asked for by name,
and listed by :func:`registry_problems`; the other engines stay usable.
"""
from __future__ import annotations

import importlib
import importlib.metadata as _metadata
import traceback
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Literal

from engines.engine import Availability, Capabilities, Engine
from engines.errors import (EngineDefinitionError, EngineImportError, InputError,
                            LockstepError, UnknownEngine)

ENTRY_POINT_GROUP = "lockstep.engines"

BUILTIN: dict[str, str] = {
    "ort-cpu": "engines.backends.ort_cpu:OrtCpuEngine",
    "onnx-reference": "engines.backends.onnx_reference:OnnxReferenceEngine",
    "native-host": "engines.backends.native_host:NativeHostEngine",
    "native-cuda": "engines.backends.native_cuda:NativeCudaEngine",
    "ort-cuda": "engines.backends.ort_cuda:OrtCudaEngine",
    "hf": "engines.backends.hf:HfEngine",
    "hf-cuda": "engines.backends.hf:HfCudaEngine",
    "ort-genai": "engines.backends.ort_genai:OrtGenaiEngine",
    "ort-genai-cuda": "engines.backends.ort_genai:OrtGenaiCudaEngine",
    "ort-genai-int4": "engines.backends.ort_genai:OrtGenaiInt4Engine",
    "llama-cpp": "engines.backends.llama_cpp:LlamaCppEngine",
    "vllm": "engines.backends.vllm_engine:VllmEngine",
}

REFERENCE_ENGINE = "ort-cpu"

# characters an engine name may not hold: ":" marks a "module:Class" reference, "," separates
# names on the command line, whitespace would not survive either
_FORBIDDEN_IN_NAME = (":", ",")


# -- checking one class --------------------------------------------------------------------

def _label(obj: object) -> str:
    """``module.qualname`` of a class (or the repr of anything else)."""
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    return repr(obj)


def _target_of(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def check_engine_class(cls: object, expected_name: str | None = None) -> type[Engine]:
    """Refuse a class that cannot be trusted to name its own results; return it otherwise.

    Refused: anything that is not an :class:`engines.engine.Engine` subclass; a class that
    does not define ``name`` itself (an inherited name would record its results as its
    parent's); a ``name`` that is not a non-empty string usable on the command line; and,
    when ``expected_name`` is given, a ``name`` other than the one the class is registered
    under. Raises :class:`EngineDefinitionError` naming the class, the field, the value and
    the remedy."""
    label = _label(cls)
    if not isinstance(cls, type) or not issubclass(cls, Engine):
        raise EngineDefinitionError(
            f"{label} is not an engine class: it does not derive from engines.engine.Engine",
            field="class", value=label,
            remedy="derive it from engines.engine.Engine (or a built-in engine class) and "
                   "set `name = \"...\"` on the class")
    suggestion = expected_name if expected_name else "..."
    remedy = f"set `name = \"{suggestion}\"` on the class {label}"
    if "name" not in cls.__dict__:
        owner = next((k for k in cls.__mro__[1:] if "name" in k.__dict__), None)
        inherited = getattr(cls, "name", None)
        if owner is None:
            message = f"engine class {label} does not set its own `name`"
        else:
            message = (f"engine class {label} does not set its own `name`: it inherits "
                       f"{inherited!r} from {_label(owner)}, so its results would be recorded "
                       f"as {inherited!r}'s")
        raise EngineDefinitionError(message, field="name", value=inherited, remedy=remedy)
    own = cls.__dict__["name"]
    if not isinstance(own, str) or not own.strip():
        raise EngineDefinitionError(
            f"engine class {label} has a `name` that is not a non-empty string",
            field="name", value=own, remedy=remedy)
    if own != own.strip() or any(ch.isspace() for ch in own) \
            or any(ch in own for ch in _FORBIDDEN_IN_NAME):
        raise EngineDefinitionError(
            f"engine class {label} has a `name` with whitespace, ':' or ',' in it; such a "
            f"name cannot be given on the command line",
            field="name", value=own, remedy=remedy.replace("...", "a-name-like-this"))
    if expected_name is not None and own != expected_name:
        raise EngineDefinitionError(
            f"engine class {label} is registered as {expected_name!r} but its `name` is "
            f"{own!r}: its results would be recorded under {own!r}",
            field="name", value=own,
            remedy=f"{remedy}, or register it under {own!r}")
    _check_capabilities(cls, label)
    return cls


_FLAGS = ("graph_slots", "speculative", "logits_audit", "decodes_itself", "batch_invariant",
          "logprobs_audit", "concurrent")


def _check_capabilities(cls: type[Engine], label: str) -> Capabilities:
    """The declared capabilities must be what they claim to be: a residency string, booleans,
    and a ``generate`` of the class's own wherever ``decodes_itself`` is declared."""
    caps = cls.capabilities()
    if not isinstance(caps, Capabilities):
        raise EngineDefinitionError(
            f"engine class {label}: capabilities() returned {type(caps).__name__}, not "
            f"engines.engine.Capabilities", field="capabilities", value=repr(caps),
            remedy="declare capabilities as class attributes and leave capabilities() alone")
    if not isinstance(caps.residency, str) or not caps.residency:
        raise EngineDefinitionError(
            f"engine class {label} declares a residency that is not a non-empty string",
            field="residency", value=caps.residency,
            remedy='set `residency = "host"` (or "cuda:N") on the class')
    for flag in _FLAGS:
        value = caps.to_dict()[flag]
        if not isinstance(value, bool):
            raise EngineDefinitionError(
                f"engine class {label} declares {flag} = {value!r}, not a bool",
                field=flag, value=value, remedy=f"set `{flag} = True` or `False` on the class")
    if caps.decodes_itself and cls.generate is Engine.generate:
        raise EngineDefinitionError(
            f"engine class {label} declares decodes_itself but does not implement generate",
            field="decodes_itself", value=True,
            remedy="implement generate(prompt, max_new_tokens, audit=False, ignore_eos=False) "
                   "returning a "
                   "DecodeResult, or set `decodes_itself = False` to be driven through "
                   "run_component")
    if caps.concurrent and cls.generate_concurrent is Engine.generate_concurrent:
        raise EngineDefinitionError(
            f"engine class {label} declares concurrent but does not implement "
            f"generate_concurrent", field="concurrent", value=True,
            remedy="implement generate_concurrent(prompts, max_new_tokens, audit=False), or "
                   "set `concurrent = False`")
    return caps


# -- where engines come from ---------------------------------------------------------------

@dataclass(frozen=True)
class _Entry:
    name: str
    target: str  # "module:attr"
    origin: str  # for messages: "built-in engine 'x'" or "entry point 'x' of distribution 'd'"
    dist: str | None = None
    version: str | None = None  # the distribution's version (entry points only)


@dataclass(frozen=True)
class _Scan:
    entries: dict[str, _Entry]
    collisions: dict[str, tuple[str, str | None]]  # entry point name -> (why, distribution)
    conflicts: dict[str, str]   # name -> why two distributions claim it
    plugins: tuple[_Entry, ...] = ()  # every entry point seen, clashing ones included


def _dist_name(ep) -> str | None:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) if dist is not None else None


def _dist_version(ep) -> str | None:
    dist = getattr(ep, "dist", None)
    version = getattr(dist, "version", None) if dist is not None else None
    if version is None and dist is not None and getattr(dist, "name", None):
        try:
            version = _metadata.version(dist.name)
        except _metadata.PackageNotFoundError:
            version = None
    return version


def _ep_origin(name: str, dist: str | None) -> str:
    return f"entry point {name!r} of distribution {dist!r}" if dist else f"entry point {name!r}"


@lru_cache(maxsize=1)
def _entries() -> _Scan:
    """Built-ins plus the entry point group, scanned once; nothing is imported here."""
    entries = {name: _Entry(name, target, f"built-in engine {name!r}")
               for name, target in BUILTIN.items()}
    collisions: dict[str, tuple[str, str | None]] = {}
    conflicts: dict[str, str] = {}
    plugins: list[_Entry] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = _dist_name(ep)
        origin = _ep_origin(ep.name, dist)
        if ep.name in BUILTIN and ep.value.strip() == BUILTIN[ep.name]:
            continue  # declares the built-in itself: nothing is replaced
        plugins.append(_Entry(ep.name, ep.value.strip(), origin, dist, _dist_version(ep)))
        if ep.name in BUILTIN:
            collisions[ep.name] = (
                f"{origin} ({ep.value}) collides with the built-in engine {ep.name!r} "
                f"({BUILTIN[ep.name]}); a built-in engine is never replaced", dist)
            continue
        seen = entries.get(ep.name)
        if seen is not None:
            if seen.target != ep.value.strip():
                conflicts[ep.name] = (f"{seen.origin} ({seen.target}) and {origin} "
                                      f"({ep.value}) both claim the engine name {ep.name!r}")
            continue
        entries[ep.name] = plugins[-1]
    return _Scan(entries, collisions, conflicts, tuple(plugins))


def _collision_error(scan: _Scan) -> EngineDefinitionError:
    names = sorted(scan.collisions)
    dists = sorted({scan.collisions[n][1] for n in names if scan.collisions[n][1]})
    where = " or ".join(repr(d) for d in dists) if dists else "the distribution declaring it"
    return EngineDefinitionError(
        "; ".join(scan.collisions[n][0] for n in names), field="engine",
        value=names[0] if len(names) == 1 else names,
        remedy=f"rename the entry point in the [project.entry-points.\"{ENTRY_POINT_GROUP}\"] "
               f"table of {where}, or uninstall it")


def _consult() -> _Scan:
    """The scan, after refusing an entry point that would replace a built-in engine."""
    scan = _entries()
    if scan.collisions:
        raise _collision_error(scan)
    return scan


# -- loading -------------------------------------------------------------------------------

def _import_error(entry_origin: str, value: str, module_name: str, exc: BaseException,
                  dist: str | None) -> EngineImportError:
    frames = traceback.extract_tb(exc.__traceback__)
    # the innermost frame outside the import machinery is where the module broke
    frames = [f for f in frames if "importlib" not in f.filename and f.filename != __file__]
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) and exc.name else None
    if missing and (module_name == missing or module_name.startswith(missing + ".")):
        remedy = (f"check the module path {module_name!r}, or install the package that "
                  f"provides {missing!r}")
    elif missing:
        remedy = f"install the missing module {missing!r} that {module_name!r} imports"
    else:
        remedy = f"fix the error in {module_name!r}"
    if dist:
        remedy += f", or uninstall {dist!r}"
    return EngineImportError(
        f"{entry_origin}: module {module_name!r} failed to import: "
        f"{type(exc).__name__}: {exc}{at}",
        import_error=exc, field="engine", value=value, remedy=remedy)


def _load(target: str, *, origin: str, value: str, dist: str | None = None) -> object:
    """Import ``module:attr`` (attr may be dotted) and return the attribute, unchecked."""
    module_name, _, attr = target.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or not attr:
        raise EngineDefinitionError(
            f"{origin}: {target!r} is not of the form package.module:ClassName",
            field="engine", value=value, remedy="write it as package.module:ClassName")
    try:
        obj = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # any failure, not only a missing module
        raise _import_error(origin, value, module_name, exc, dist) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EngineDefinitionError(
                f"{origin}: module {module_name!r} has no attribute {attr!r}",
                field="engine", value=value,
                remedy=f"name a class defined in {module_name!r}") from None
    return obj


def _resolve_entry(entry: _Entry) -> type[Engine]:
    cls = _load(entry.target, origin=entry.origin, value=entry.name, dist=entry.dist)
    return check_engine_class(cls, expected_name=entry.name)


def _resolve_reference(ref: str, scan: _Scan) -> type[Engine]:
    """A ``"package.module:ClassName"`` reference: its class, checked, under its own name."""
    found = _load(ref, origin=f"engine class {ref!r}", value=ref)
    if not (isinstance(found, type) and issubclass(found, Engine)):  # what the user typed
        raise EngineDefinitionError(
            f"{ref!r} names {_label(found)}, not an engine class (one deriving from "
            f"engines.engine.Engine)", field="engine", value=ref,
            remedy="name an engine class as package.module:ClassName, or a registered "
                   "engine (lockstep engines lists them)")
    cls = check_engine_class(found)
    name, label = cls.name, _label(cls)
    if name in BUILTIN and _target_of(cls) != BUILTIN[name]:
        raise EngineDefinitionError(
            f"engine class {label} (from {ref!r}) is named {name!r}, which collides with the "
            f"built-in engine {name!r} ({BUILTIN[name]}); a built-in engine is never replaced",
            field="name", value=name,
            remedy=f"give it a name of its own: set `name = \"...\"` on the class {label}")
    if name in scan.conflicts:
        raise EngineDefinitionError(
            f"engine class {label} (from {ref!r}) is named {name!r}, a name two installed "
            f"distributions already claim: {scan.conflicts[name]}",
            field="name", value=name,
            remedy=f"give it a name of its own: set `name = \"...\"` on the class {label}")
    entry = scan.entries.get(name)
    if entry is not None and name not in BUILTIN and entry.target != _target_of(cls):
        try:
            same = _load(entry.target, origin=entry.origin, value=name, dist=entry.dist) is cls
        except EngineDefinitionError:
            same = False
        if not same:
            raise EngineDefinitionError(
                f"engine class {label} (from {ref!r}) is named {name!r}, which collides with "
                f"the {entry.origin} ({entry.target})",
                field="name", value=name,
                remedy=f"give it a name of its own: set `name = \"...\"` on the class {label}")
    return cls


# -- the registry's API --------------------------------------------------------------------

def get_engine_class(name: str) -> type[Engine]:
    """The engine class registered as ``name`` (built in or by entry point), or the class a
    ``"package.module:ClassName"`` reference names; always checked with
    :func:`check_engine_class`.

    A server is named ``http:FLAVOUR[=URL]`` or ``http=URL``
    (``engines.backends.http.spelling``): its class is made for that spelling.

    Raises :class:`UnknownEngine` for a name nothing provides, :class:`EngineImportError` when
    the engine's module fails to import, :class:`EngineDefinitionError` for a class that
    cannot be trusted to name its results (or an entry point that would replace a built-in)."""
    scan = _consult()
    if name in scan.conflicts:
        raise EngineDefinitionError(
            scan.conflicts[name], field="engine", value=name,
            remedy="uninstall one of the two distributions, or rename one entry point")
    entry = scan.entries.get(name)
    if entry is not None:
        return _resolve_entry(entry)
    from engines.backends.http.spelling import engine_class, is_http_spelling

    if is_http_spelling(name):  # a server: http:llama-server, http:openai=URL, http=URL
        return check_engine_class(engine_class(name))
    if ":" in name:
        return _resolve_reference(name, scan)
    raise UnknownEngine(f"no engine named {name!r}", field="engine", value=name,
                        remedy=f"choose one of: {', '.join(engine_names())}; or name a class "
                               f"as package.module:ClassName")


def resolve_engine(ref: str) -> tuple[str, type[Engine]]:
    """``(engine name, class)`` for a registered name or a ``"module:Class"`` reference: the
    name to record results under is always the class's own ``name``."""
    cls = get_engine_class(ref)
    return cls.name, cls


def class_reference(cls: type) -> str | None:
    """``module:Class`` of an engine class that its ``name`` does not find here (it was
    named by its class, ``--engines pkg.module:Class``), else None: what an evidence record
    keeps so ``explain`` and ``repro`` can load the engine again without being told."""
    try:
        if get_engine_class(cls.name) is cls:
            return None
    except LockstepError:
        pass
    return _target_of(cls)


def _spelling(ref: object) -> str:
    """How an entry of an engines list was written: the text itself, or a class as
    ``module:Class``."""
    return f"class {_target_of(ref)}" if isinstance(ref, type) else repr(ref)


def resolve_engine_list(refs, *, field: str = "engines",
                        value: object = None) -> dict[str, type[Engine]]:
    """An engines list (registered names, ``"module:Class"`` references, entry point names or
    classes) -> ``{engine name: class}`` in the list's order, each class checked with
    :func:`check_engine_class`, and the settings each reads (``Engine.check_settings``); an
    unknown or ill-defined engine, or a bad setting, fails here.

    One engine named twice is an ``InputError`` (``field``, ``value``: the list as given
    unless ``value`` says otherwise): the same spelling twice, two spellings of one class
    (``native-host`` and ``engines.backends.native_host:NativeHostEngine``), or two different
    classes with one ``name``. Keyed by name, either would otherwise merge silently into one
    engine, and the list would not be what runs."""
    refs = list(refs)
    shown = value if value is not None else [r if isinstance(r, str) else _spelling(r)
                                             for r in refs]
    out: dict[str, type[Engine]] = {}
    first: dict[str, object] = {}  # engine name -> the entry that named it first
    for ref in refs:
        cls = check_engine_class(ref) if isinstance(ref, type) else get_engine_class(str(ref))
        cls.check_settings()
        name = cls.name
        if name not in out:
            out[name], first[name] = cls, ref
            continue
        earlier = first[name]
        kept = ",".join(r if isinstance(r, str) else _target_of(r) for r in first.values())
        if out[name] is not cls:
            raise InputError(
                f"two different engine classes are named {name!r}: {_label(out[name])} (from "
                f"{_spelling(earlier)}) and {_label(cls)} (from {_spelling(ref)}); their "
                f"results would be recorded under one name",
                field=field, value=shown,
                remedy=f"name only one of them, or give one a `name` of its own")
        if isinstance(earlier, str) and isinstance(ref, str) and earlier == ref:
            raise InputError(f"{field} names {ref!r} twice", field=field, value=shown,
                             remedy=f"name each engine once: {kept}")
        raise InputError(
            f"{field} names the engine class {_label(cls)} ({name!r}) twice: as "
            f"{_spelling(earlier)} and as {_spelling(ref)}",
            field=field, value=shown,
            remedy=f"name each engine once (either spelling records as {name!r}): {kept}")
    return out


def engine_names() -> list[str]:
    """Every engine this build provides (built in or by entry point) whose class loads and
    passes :func:`check_engine_class`, available here or not. Broken ones are left out and
    listed by :func:`registry_problems`."""
    scan = _consult()
    names = []
    for name, entry in scan.entries.items():
        if name in scan.conflicts:
            continue
        try:
            _resolve_entry(entry)
        except EngineDefinitionError:
            continue
        names.append(name)
    return names


def registry_problems() -> dict[str, str]:
    """Engine name -> what is wrong with it, for every registered engine that cannot be used:
    a module that fails to import, a class refused by :func:`check_engine_class`, an entry
    point that would replace a built-in, a name two distributions claim. Never raises."""
    scan = _entries()
    problems: dict[str, str] = {}
    for name, entry in scan.entries.items():
        if name in scan.conflicts:
            problems[name] = scan.conflicts[name]
            continue
        try:
            _resolve_entry(entry)
        except EngineDefinitionError as err:
            problems[name] = str(err)
    for name, (why, _dist) in scan.collisions.items():
        problems[name] = why
    return problems


def availability(name: str) -> Availability:
    return get_engine_class(name).availability()


def available_engines() -> list[str]:
    """Names of the engines that can run here (their dependencies are present)."""
    out = []
    for name in engine_names():
        try:
            if get_engine_class(name).availability().ok:
                out.append(name)
        except LockstepError:
            continue
    return out


# -- what `lockstep engines` lists ---------------------------------------------------------

def lockstep_version() -> str:
    """The installed lockstep distribution's version ("unknown" for an uninstalled checkout)."""
    try:
        return _metadata.version("lockstep")
    except _metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class EngineListing:
    """One engine as the registry knows it, loadable or not (``describe_engines``)."""
    name: str
    target: str                    # "package.module:Class"
    source: Literal["built-in", "entry point"]
    distribution: str | None       # the distribution declaring the entry point
    version: str | None            # that distribution's version; lockstep's for built-ins
    engine_class: type[Engine] | None  # None when it cannot be loaded
    problem: str | None = None     # why it cannot be used: import error, refused class, clash
    clash: bool = False            # its name is claimed twice (a built-in's, or two plugins')


def describe_engines() -> list[EngineListing]:
    """Every engine the registry knows, built in and by entry point, each with where it comes
    from, its version, its class (loaded and checked) or what is wrong with it. A plugin
    whose name clashes with a built-in's or another plugin's is listed as a clash. Never
    raises."""
    scan = _entries()
    own = lockstep_version()
    out: list[EngineListing] = []

    def load(entry: _Entry) -> tuple[type[Engine] | None, str | None]:
        try:
            return _resolve_entry(entry), None
        except EngineDefinitionError as err:
            return None, str(err)
        except Exception as exc:  # a broken availability/capabilities must not hide the rest
            return None, f"{entry.origin}: {type(exc).__name__}: {exc}"

    for name, target in BUILTIN.items():
        cls, problem = load(scan.entries[name])
        out.append(EngineListing(name, target, "built-in", "lockstep", own, cls, problem))
    for entry in scan.plugins:
        if entry.name in scan.collisions:
            out.append(EngineListing(entry.name, entry.target, "entry point", entry.dist,
                                     entry.version, None, scan.collisions[entry.name][0], True))
        elif entry.name in scan.conflicts:
            out.append(EngineListing(entry.name, entry.target, "entry point", entry.dist,
                                     entry.version, None, scan.conflicts[entry.name], True))
        else:
            cls, problem = load(entry)
            out.append(EngineListing(entry.name, entry.target, "entry point", entry.dist,
                                     entry.version, cls, problem))
    return out
