"""Package format v1: the folder engines load (package.yaml + ONNX components).

``load_package`` is the one entry point; it returns a ``Package`` only after the YAML, the
paths and every declared port have been checked against the real graphs.
"""
from engines.package.hashing import package_content_hash
from engines.package.load import Package, load_package, locate, read_spec
from engines.package.ports import graph_inputs, graph_outputs
from engines.package.schema import (DTYPES, FORMAT_VERSION, INPUT_ROLES, KV_UPDATES,
                                    MODEL_FREE_KINDS, OUTPUT_ROLES, PACKAGE_FILE,
                                    SPECULATIVE_KINDS, STATE_KINDS, CarrySpec, ComponentSpec,
                                    DecodingSpec, EmbeddingSpec, GreedySpec, PackageSpec,
                                    ReferenceSpec, SpeculativeSpec, StateCellSpec, TokenizerSpec,
                                    field_path)

__all__ = [
    "DTYPES", "FORMAT_VERSION", "INPUT_ROLES", "KV_UPDATES", "MODEL_FREE_KINDS",
    "OUTPUT_ROLES", "PACKAGE_FILE",
    "SPECULATIVE_KINDS", "STATE_KINDS", "CarrySpec", "ComponentSpec", "DecodingSpec",
    "EmbeddingSpec", "GreedySpec", "Package", "PackageSpec", "ReferenceSpec",
    "SpeculativeSpec",
    "StateCellSpec", "TokenizerSpec", "field_path", "graph_inputs", "graph_outputs",
    "load_package", "locate", "package_content_hash", "read_spec",
]
