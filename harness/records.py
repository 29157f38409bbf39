"""One evidence record per matrix cell, whatever its verdict (error and unavailable too)."""
from __future__ import annotations

import math

from engines.tokenizer import decode_each
from harness import evidence as ev
from harness.judgement import first_difference
from harness.topk_audit import TopkAudit


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _divergence(finding, trace) -> ev.Divergence | None:
    if finding is None:
        return None
    margin = None
    if trace is not None and finding.step < len(trace.margins):
        margin = _finite(trace.margins[finding.step])
    return ev.Divergence(step=finding.step, reference_token=finding.oracle_token,
                         engine_token=finding.engine_token, margin=margin,
                         verdict=finding.verdict, rank=finding.rank, gap=_finite(finding.gap),
                         reason=finding.reason)


def _judgement(j, oracle_name: str, tol, oracle_package=None, oracle_check=None) -> ev.Judgement:
    ref = check = None
    if oracle_check is not None:
        c = oracle_check
        check = ev.OracleCheck(engine=c.engine, against=c.against, prefix_tokens=c.prefix_tokens,
                               steps=c.steps, max_abs=c.max_abs, nmse=c.nmse)
    if oracle_package is not None:
        ref = ev.PackageRef(name=oracle_package.spec.name,
                            content_hash=oracle_package.content_hash,
                            path=str(oracle_package.root))
    return ev.Judgement(
        oracle=f"oracle:{oracle_name}", oracle_mode=j.oracle_mode, oracle_package=ref,
        oracle_check=check,
        near_tie_margin=tol.near_tie_margin,
        steps_judged=j.steps_judged, defects=j.defects, near_ties=j.near_ties,
        findings=[ev.StepFinding(step=f.step, engine_token=f.engine_token,
                                 oracle_token=f.oracle_token, rank=f.rank, gap=_finite(f.gap),
                                 verdict=f.verdict, reason=f.reason, oracle_top=f.oracle_top,
                                 engine_top=f.engine_top) for f in j.findings])


def _audit(audit, tol) -> ev.LogitsAuditRecord:
    topk = isinstance(audit, TopkAudit)
    reasons = audit.reasons if topk else {}
    return ev.LogitsAuditRecord(
        dtype=audit.dtype, decode=audit.decode,
        tolerance={"logits_max_abs": tol.logits_max_abs, "logits_nmse": tol.logits_nmse},
        steps=[ev.StepAuditRecord(step=s.step, max_abs=_finite(s.max_abs),
                                  max_rel=_finite(s.max_rel), nmse=_finite(s.nmse),
                                  non_finite=s.non_finite, ok=s.ok, where=s.where or None,
                                  finding=reasons.get(s.step), kl=_finite(s.kl))
               for s in audit.steps],
        non_finite_steps=audit.non_finite_steps,
        out_of_tolerance_steps=audit.out_of_tolerance_steps,
        worst_max_abs=_finite(audit.worst_max_abs), worst_nmse=_finite(audit.worst_nmse),
        readback_bytes=audit.readback_bytes,
        **({"kind": "top-k", "top_k": audit.k, "logprob_bound": audit.bound,
            "unseen": audit.unseen} if topk else {}))


def _concurrency(check) -> ev.ConcurrencyRecord | None:
    """--concurrency N: the prompt's stream among N against its stream alone."""
    if check is None:
        return None
    j = check.judgement
    return ev.ConcurrencyRecord(
        requests=check.requests, slot=check.slot, tokens=list(check.tokens),
        digest=ev.token_digest(check.tokens), first_difference=check.first_difference,
        steps_compared=check.steps_compared,
        max_logprob_delta=check.max_logprob_delta,
        worst_step=check.worst_step, logprob_bound=check.bound,
        concurrent_verdict=j.verdict if j is not None else None)


def _prompt(package, cell) -> ev.PromptRef:
    """The prompt's ids, their text, and for a text or chat prompt what they were made of."""
    ref = ev.PromptRef(name=cell.prompt_name, ids=list(cell.prompt),
                       text=decode_each(package, cell.prompt, joined=True))
    given = cell.prompt_source  # harness.prompts.ResolvedPrompt, or None for plain ids
    if given is None or given.source.kind == "ids":
        return ref
    src = given.source
    return ref.model_copy(update={
        "source": src.kind,
        "source_text": src.text if src.kind == "text" else given.rendered,
        "messages": ([ev.ChatMessage(role=r, content=c) for r, c in src.messages]
                     if src.kind == "chat" else None),
        "chat_template": given.chat_template})


def _band(band, stats) -> ev.BandRecord:
    return ev.BandRecord(scheme=band.scheme,
                         bounds={k: v for k, v in band.to_dict().items()
                                 if k not in ("scheme", "provenance")},
                         provenance=dict(band.provenance), steps=stats.steps,
                         mean_kl=_finite(stats.mean_kl), p99_kl=_finite(stats.p99_kl),
                         flips=stats.flips, flip_p=stats.flip_p, reasons=list(stats.reasons),
                         within=stats.within, worst=dict(stats.worst),
                         ratios=dict(stats.ratios), first_step=stats.first_step)


def _quality(package, quality) -> ev.QualityRecord:
    original = package.spec.original
    return ev.QualityRecord(original=ev.PackageRef(name=original.folder,
                                                   content_hash=original.content_hash),
                            **quality.to_dict())


def cell_record(run_id, env, package, cell, trace, oracle_name: str, tol,
                oracle_package=None, oracle_check=None, band=None) -> ev.EvidenceRecord:
    """The evidence record of ``cell`` (a ``harness.cells.CellResult``); ``band``: the
    quantized scheme's band it was judged by (``engines.tolerances.Band``)."""
    kind, _, width = cell.mode.partition("/w")
    mode = ev.Mode(kind=kind, width=int(width) if width else None)
    reference = None
    if trace is not None:
        reference = ev.ReferenceRef(engine=f"oracle:{trace.engine}", tokens=list(trace.tokens),
                                    digest=ev.token_digest(trace.tokens),
                                    margins=list(trace.margins))
    greedy = None
    if cell.greedy_tokens is not None:
        gj = cell.greedy_judgement
        parted = first_difference(cell.tokens, cell.greedy_tokens)
        greedy = ev.GreedyRef(tokens=list(cell.greedy_tokens),
                              digest=ev.token_digest(cell.greedy_tokens),
                              verdict=gj.verdict, first_finding=_divergence(gj.first, trace),
                              agrees_with_speculative=parted is None, first_difference=parted)
    error = None
    if cell.error is not None:
        e = cell.error
        error = ev.ErrorInfo(stage=e.stage, type=e.type, message=e.message, step=e.step,
                             traceback=list(e.traceback))
    timings = None
    if cell.ledger is not None:
        timings = ev.Timings(wall_s=cell.wall_s, tokens_per_s=cell.tokens_per_s,
                             phase_seconds=dict(cell.ledger.phase_seconds),
                             judge_s=cell.judge_s, oracle_forwards=cell.oracle_forwards,
                             oracle_positions=cell.oracle_positions)
    return ev.EvidenceRecord(
        run_id=run_id, environment=env,
        package=ev.PackageRef(name=package.spec.name, content_hash=package.content_hash,
                              path=str(package.root)),
        engine=cell.engine, engine_provenance=getattr(cell, "provenance", None) or None,
        engine_class=cell.engine_class,
        mode=mode,
        prompt=_prompt(package, cell),
        status=cell.status, reason=cell.reason or None, error=error,
        tokens=list(cell.tokens), token_digest=ev.token_digest(cell.tokens),
        tokens_text=decode_each(package, cell.tokens) if cell.tokens else None,
        reference=reference, divergence=_divergence(cell.divergence, trace),
        judgement=None if cell.judgement is None else _judgement(cell.judgement, oracle_name,
                                                                 tol, oracle_package,
                                                                 oracle_check),
        logits_audit=None if cell.audit is None else _audit(cell.audit, tol),
        greedy=greedy, concurrency=_concurrency(cell.concurrency),
        numeric_scheme=cell.scheme,
        band=None if band is None or cell.band is None else _band(band, cell.band),
        quality=None if cell.quality is None else _quality(package, cell.quality),
        ledger=cell.ledger.to_dict() if cell.ledger is not None else ev.LedgerRecord(),
        acceptance_per_round=list(cell.acceptance_per_round),
        timings=timings, budgets=list(cell.budgets), verdicts=dict(cell.verdicts),
    )
