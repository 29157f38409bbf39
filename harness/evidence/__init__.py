"""Evidence: one versioned JSON record per run cell, written atomically, read strictly."""
from .environment import collect_environment, git_commit
from .schema import (CLAIMS, SCHEMA_VERSION, BandRecord, BudgetCheck, ChatMessage,
                     ConcurrencyRecord, Divergence, Environment, ErrorInfo, EvidenceRecord,
                     GraphSlotRecord, GreedyRef, Judgement, LedgerRecord, LogitsAuditRecord,
                     MemorySample, Mode, OracleCheck, PackageRef, PromptRef, QualityRecord,
                     ReferenceRef, StepAuditRecord, StepFinding, Timings,
                     evidence_json_schema, found_status, new_run_id, token_digest)
from .store import (EvidenceError, evidence_file_name, evidence_files, evidence_write_error,
                    load_evidence_dir, load_evidence_files, prepare_evidence_dir, read_evidence,
                    write_evidence)

__all__ = [
    "CLAIMS", "SCHEMA_VERSION", "BandRecord", "BudgetCheck", "ChatMessage", "ConcurrencyRecord",
    "Divergence", "Environment", "ErrorInfo",
    "EvidenceError", "EvidenceRecord", "GraphSlotRecord", "GreedyRef", "Judgement",
    "LedgerRecord", "LogitsAuditRecord", "MemorySample", "Mode", "OracleCheck", "PackageRef", "PromptRef", "QualityRecord",
    "ReferenceRef", "StepAuditRecord", "StepFinding", "Timings", "collect_environment", "evidence_file_name",
    "evidence_files", "evidence_json_schema", "found_status", "evidence_write_error", "prepare_evidence_dir", "git_commit", "load_evidence_dir", "load_evidence_files", "new_run_id",
    "read_evidence", "token_digest", "write_evidence",
]
