"""The engine protocol: load a package once, run its components, own a ledger and tensor ops.

Engines differ only in how a component runs and where values live; the workflow
interpreter (``engines.workflow``) drives every one of them the same way.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from engines.ledger import Ledger

if TYPE_CHECKING:  # pragma: no cover
    from engines.package import Package
    from engines.tensor_ops.base import TensorOps


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


class Engine(abc.ABC):
    """One engine instance holds one package's components, loaded once."""

    name: ClassVar[str]
    residency: ClassVar[str] = "host"
    description: ClassVar[str] = ""
    # claim 2: row i of an M-row forward equals the M=1 forward bit for bit, so its
    # speculative stream must equal its greedy stream exactly (else that is a defect)
    batch_invariant: ClassVar[bool] = False

    def __init__(self, package: "Package"):
        self.package = package
        self.ledger = Ledger()
        self.tensor_ops: TensorOps = self._make_tensor_ops()

    @classmethod
    @abc.abstractmethod
    def availability(cls) -> Availability:
        """Whether this engine can run here, and if not, why (missing dependency, no device)."""

    def _make_tensor_ops(self) -> "TensorOps":
        from engines.tensor_ops.host import HostTensorOps

        return HostTensorOps(self.ledger)

    @abc.abstractmethod
    def run_component(self, component: str, feeds: dict[str, Any]) -> dict[str, Any]:
        """Run one forward of ``component``; feeds and results keyed by ONNX graph names."""

    def reset_ledger(self) -> Ledger:
        """Start a fresh ledger (per decode session) and rebind the tensor ops to it."""
        self.ledger = Ledger()
        self.tensor_ops = self._make_tensor_ops()
        return self.ledger

    def close(self) -> None:
        """Release what the engine holds; the default holds nothing that needs it."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
