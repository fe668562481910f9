"""The tiny DDTree servers of bench/ddtree (make_tiny.py): their geometries, and the runs recorded under
bench/results/ddtree-*/ (results.json from bench/ddtree/serve_check.py with the servers' logs). Read by the memory
arithmetic's tests and model.fit's."""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "qwen3": {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "hidden_size": 256, "intermediate_size": 512, "vocab_size": 64, "max_position_embeddings": 4096},
    "dsv3": {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 256,
             "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
             "moe_intermediate_size": 128, "intermediate_size": 512, "n_routed_experts": 8,
             "num_experts_per_tok": 2, "vocab_size": 64, "max_position_embeddings": 4096},
    "dflash": {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
               "hidden_size": 256, "vocab_size": 64, "block_size": 8},
}
# make_tiny.py --dsv3-layers: the same target, deeper (capture memory against the layer count)
TINY.update({f"dsv3-l{n}": {**TINY["dsv3"], "num_hidden_layers": n} for n in (12, 24)})


def _logs_of(tgz: Path, plain: list[Path]) -> dict[str, list[str]]:
    logs = {p.name: p.read_text(errors="replace").splitlines() for p in plain}
    if tgz.exists():
        with tarfile.open(tgz) as tf:
            for m in tf.getmembers():
                fh = tf.extractfile(m) if m.isfile() else None
                if fh is not None:
                    logs[Path(m.name).name] = fh.read().decode(errors="replace").splitlines()
    return logs


def ddtree_runs() -> list[tuple[str, dict, list[str]]]:
    """(name, run record, log lines) of every server run under bench/results/ddtree-*/: ``results{S}.json`` or
    ``results{S}.json.gz`` from bench/ddtree/serve_check.py (``runs``: a list, of its first version; ``servers``:
    by name, of the current one), its logs as ``*.log`` or in ``logs{S}.tgz`` (the same suffix ``S``: one call
    of a session each). Each record says whether that server started ``alone`` (its wave had no other)."""
    out = []
    for results in sorted(ROOT.glob("bench/results/ddtree-*/results*.json*")):
        suffix = results.name[len("results"):].split(".json")[0]
        logs = _logs_of(results.parent / f"logs{suffix}.tgz", list(results.parent.glob("*.log")))
        raw = gzip.decompress(results.read_bytes()) if results.name.endswith(".gz") else results.read_bytes()
        doc = json.loads(raw)
        records = doc.get("runs") or [{"name": n, **r} for n, r in (doc.get("servers") or {}).items()]
        waves: dict = {}
        for run in records:
            waves.setdefault((run.get("config") or {}).get("wave", 1), []).append(run["name"])
        first = "runs" in doc  # the first version started one server at a time; the current one a wave at once
        for run in records:
            run = {**run, "alone": first or len(waves[(run.get("config") or {}).get("wave", 1)]) == 1,
                   "first_version": first}
            lines = logs.get(Path(run.get("log") or "").name)
            if lines and run.get("argv") and run.get("config"):
                out.append((f"{results.parent.name}/{results.name}/{run['name']}", run, lines))
    return out
