"""Per prompt: http-llama-server's tokens against llama-cpp's (the same prompt alone), the
top-k audit's worst logprob difference, the concurrency verdict."""
import json, sys
from pathlib import Path
from harness.judge import first_difference
recs = [json.loads(p.read_text()) for p in Path(sys.argv[1]).glob("*.json")]
by = {}
for r in recs:
    by.setdefault(r["prompt"]["name"], {})[r["engine"]] = r
rows = []
for name in sorted(by):
    e = by[name]
    s, l = e.get("http-llama-server"), e.get("llama-cpp")
    parted = first_difference(s["tokens"], l["tokens"]) if s and l else "n/a"
    a = s["logits_audit"] if s else None
    c = s.get("concurrency") if s else None
    print(f"{name:18s} server {s['status']:9s} llama-cpp {l['status'] if l else '-':9s} "
          f"tokens {'same' if parted is None else 'part at ' + str(parted):12s} "
          f"topk worst {a['worst_max_abs'] if a else None!s:8.8} out {a['out_of_tolerance_steps'] if a else '-'} "
          f"conc {s['verdicts'].get('concurrency_invariance')} first_diff {c['first_difference'] if c else '-'} "
          f"max_dlp {c['max_logprob_delta'] if c else '-'}")
