"""The tiny DDTree servers of bench/ddtree (make_tiny.py): their geometries, and the runs recorded under
bench/results/ddtree-*/ (results.json from bench/ddtree/serve_check.py with the servers' logs). Read by the memory
arithmetic's tests and model.fit's."""

from __future__ import annotations

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



def ddtree_runs() -> list[tuple[str, dict, list[str]]]:
    """(name, run record, log lines) of every server run under bench/results/ddtree-*/ (results.json from
    bench/ddtree/serve_check.py, logs as *.log or in logs.tgz)."""
    out = []
    for results in sorted(ROOT.glob("bench/results/ddtree-*/results.json")):
        logs: dict[str, list[str]] = {}
        for p in results.parent.glob("*.log"):
            logs[p.name] = p.read_text(errors="replace").splitlines()
        tgz = results.parent / "logs.tgz"
        if tgz.exists():
            with tarfile.open(tgz) as tf:
                for m in tf.getmembers():
                    fh = tf.extractfile(m) if m.isfile() else None
                    if fh is not None:
                        logs[Path(m.name).name] = fh.read().decode(errors="replace").splitlines()
        for run in json.loads(results.read_text()).get("runs", []):
            lines = logs.get(run.get("log") or "")
            if lines:
                out.append((f"{results.parent.name}/{run['name']}", run, lines))
    return out
