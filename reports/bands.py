"""The report's quantized section (claim 1d): each scheme's band with its bounds and
provenance, as the records carry it, and each quantized cell against its band, with its plot
(KL along the steps; each flip against the oracle's top-2 margin), and, where the package
declares the float model it was quantized from, the cell's quality against that model
(information beside the verdict, never part of it)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from harness.evidence import EvidenceRecord

from . import plots


@dataclass
class SchemeView:
    scheme: str
    bounds: dict[str, float]
    calibrated: list[tuple[str, str]]  # what made the band: (label, value)
    observed: dict[str, Any]
    mutations: list[dict]
    quality: dict | None
    cells: int = 0


@dataclass
class BandCellView:
    anchor: str
    record: EvidenceRecord
    status: str
    plot: Any = None
    farthest: tuple[str, float] | None = None


@dataclass
class BandSection:
    schemes: list[SchemeView] = field(default_factory=list)
    cells: list[BandCellView] = field(default_factory=list)
    unbanded: list[tuple[str, str, str]] = field(default_factory=list)  # scheme, engine, pkg
    quality: list[tuple[str, EvidenceRecord]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.schemes or self.unbanded or self.quality)


def _calibrated(prov: Mapping) -> list[tuple[str, str]]:
    build = prov.get("engine_build") or {}
    device = prov.get("device") or {}
    corpus = prov.get("corpus") or {}
    version = ", ".join(f"{k} {build[k]}" for k in ("llama_cpp_python", "ggml_version",
                                                    "ggml_commit", "builder_version")
                        if build.get(k))
    rows = [("engine", f"{prov.get('engine', '?')}" + (f" ({version})" if version else "")),
            ("date", str(prov.get("date", "?"))),
            ("device", " · ".join(str(x) for x in (device.get("model"), prov.get("host"))
                                  if x)),
            ("CPU features", " ".join(build.get("cpu_features") or device.get("features")
                                      or [])),
            ("corpus", f"{corpus.get('file', '?')} {str(corpus.get('hash', ''))[:19]} · "
                       f"{prov.get('positions', '?')} positions, {prov.get('rows', '?')} rows "
                       f"({', '.join(prov.get('batch_shapes') or [])})"),
            ("procedure", f"{prov.get('headroom', '?')}x the worst observed; mutations "
                          f"{prov.get('mutation_factor', '?')}x beyond; reproduced within "
                          f"{prov.get('reproduce_within', '?')}")]
    return [(k, v) for k, v in rows if v]


def band_section(records: Sequence[EvidenceRecord], statuses: Mapping[int, str],
                 anchors: Mapping[int, str]) -> BandSection:
    section = BandSection()
    schemes: dict[str, SchemeView] = {}
    for r in records:
        if r.band is None:
            if r.numeric_scheme is not None:
                key = (r.numeric_scheme, r.engine, r.package.name)
                if key not in section.unbanded:
                    section.unbanded.append(key)
        else:
            prov = r.band.provenance or {}
            view = schemes.get(r.band.scheme)
            if view is None:
                view = schemes[r.band.scheme] = SchemeView(
                    r.band.scheme, dict(r.band.bounds), _calibrated(prov),
                    dict(prov.get("observed") or {}), list(prov.get("mutations") or []),
                    prov.get("quality"))
            view.cells += 1
            anchor = anchors[id(r)]
            far = max(r.band.ratios.items(), key=lambda kv: kv[1]) if r.band.ratios else None
            section.cells.append(BandCellView(anchor, r, statuses[id(r)],
                                              Markup(plots.band_plot(r, anchor) or ""), far))
        if r.quality is not None:
            section.quality.append((anchors[id(r)], r))
    section.schemes = sorted(schemes.values(), key=lambda v: v.scheme)
    return section


__all__ = ["BandSection", "band_section"]
