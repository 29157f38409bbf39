"""Per-session counters: what crossed between residencies, what ran, what was allocated.

The ledger is the engine's own account. Tests compare it with an independent transfer
guard (``harness.transfer_guard``) and with the counting allocator, so every field here is
incremented at exactly one place: the code that performs the crossing or the forward.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# token_id and accept_count are the budgeted crossings (claim 4); logits_audit happens only
# in a separate, labelled audit decode (claim 1b) whose ledger no budget is judged on
READBACK_PURPOSES = ("token_id", "accept_count", "logits_audit")
BUDGETED_PURPOSES = ("token_id", "accept_count")
PHASES = ("prefill", "decode", "propose", "verify", "readvance")


@dataclass
class GraphSlotCounters:
    captures: int = 0
    replays: int = 0
    fallbacks: int = 0
    invalidations: int = 0
    resets: int = 0


@dataclass
class Ledger:
    host_staging: int = 0
    host_staging_bytes: int = 0
    host_staging_sites: list[str] = field(default_factory=list)
    readback_bytes: dict[str, int] = field(default_factory=lambda: {p: 0 for p in READBACK_PURPOSES})
    readback_count: dict[str, int] = field(default_factory=lambda: {p: 0 for p in READBACK_PURPOSES})
    h2d_bytes: int = 0
    h2d_count: int = 0
    forwards: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PHASES})
    forward_positions: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PHASES})
    phase_seconds: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    graph_slots: dict[str, GraphSlotCounters] = field(default_factory=dict)
    snapshots: int = 0
    restores: int = 0
    proposals: int = 0
    accepted: int = 0
    rejected: int = 0
    rollbacks: int = 0
    full_accepts: int = 0
    # verifications whose first row came from the decode forward queued before them (its id
    # then read only inside the accept), and forwards queued past eos and undone, never read
    shifted_verifications: int = 0
    discarded_forwards: int = 0
    live_allocations: int | None = None
    live_bytes: int | None = None

    # -- crossings -------------------------------------------------------------------------
    def record_adopt(self, nbytes: int) -> None:
        self.h2d_bytes += int(nbytes)
        self.h2d_count += 1

    def record_readback(self, purpose: str, nbytes: int) -> None:
        if purpose not in self.readback_bytes:
            raise ValueError(f"readback purpose {purpose!r} is not sanctioned; "
                             f"valid: {', '.join(READBACK_PURPOSES)}")
        self.readback_bytes[purpose] += int(nbytes)
        self.readback_count[purpose] += 1

    def record_staging(self, nbytes: int, site: str) -> None:
        self.host_staging += 1
        self.host_staging_bytes += int(nbytes)
        self.host_staging_sites.append(site)

    # -- work ------------------------------------------------------------------------------
    def record_forward(self, phase: str, positions: int, seconds: float) -> None:
        if phase not in self.forwards:
            raise ValueError(f"unknown phase {phase!r}; valid: {', '.join(PHASES)}")
        self.forwards[phase] += 1
        self.forward_positions[phase] += int(positions)
        self.phase_seconds[phase] += float(seconds)

    def slot(self, name: str) -> GraphSlotCounters:
        return self.graph_slots.setdefault(name, GraphSlotCounters())

    @property
    def readback_total(self) -> int:
        return sum(self.readback_bytes.values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
