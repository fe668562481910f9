#!/usr/bin/env python3
"""The start plan measured: the product's own `k26-doctor launch --wait` on a GPU host, cold and warm, against
what the doctor predicted (doctor/service/startplan.py), into $OUT/start-plan.json.

Run on the H200 after `bash bench/ddtree/gpu_session.sh setup` and `... pair` (payload unpacked, patch set
applied, the trained pair built), through the session script's stage, which points the profile at the pair:

    bash bench/ddtree/gpu_session.sh startplan --runs cold,warm --budget 500
    bash bench/ddtree/gpu_session.sh startplan --runs cold-prewarm,warm --budget 500
    bash bench/ddtree/gpu_session.sh startplan --runs big-cold,big-warm --big-gib 40 --budget 500

Runs (each one `launch --wait` to /health 200, then SIGTERM):
- ``cold``: empty FlashInfer and Triton caches (fresh directories named by FLASHINFER_WORKSPACE_BASE and
  TRITON_CACHE_DIR), ``--no-prewarm``: today's first start.
- ``cold-prewarm``: empty caches, the prewarm on (FlashInfer's modules compiled in parallel with the checks).
- ``warm``: the caches the previous run of this call filled.
- ``big-cold`` / ``big-warm``: a random DeepSeek-V3 of ``--big-gib`` GiB written as real safetensors shards
  (``write_big_dsv3``, bounded by ``--big-seconds``), served without speculative decoding; cold: its pages
  dropped first (``posix_fadvise(DONTNEED)`` after fsync, verified by mincore), warm: resident after the cold run.

Each run records: the bench's wall time from the launch to /health 200 (and the checks' share), the doctor's
own record of the start (``<state>/start/last.json``: plan, actual parts, comparison), the prediction's ratio to
the measured time to healthy. The issue's targets: cold within 1.15x of warm (with the prewarm and persistent
caches), each prediction within 20%.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROFILE = ROOT / "bench" / "ddtree" / "profiles" / "h200-trained-ddtree.toml"
PORT = 30000


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status == 200
    except Exception:
        return False


def launch(name: str, profile: Path, env: dict[str, str], state: Path, out: Path, extra: list[str],
           limit_s: float) -> dict:
    """One `launch --wait` to /health 200 (or the limit), then SIGTERM; the doctor's record of it."""
    log = out / f"launch-{name}.log"
    argv = [sys.executable, "-m", "doctor", "launch", "--profile", str(profile), "--python", "python3",
            "--state-dir", str(state), "--wait", *extra]
    started = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    ready_at = None
    while time.monotonic() - started < limit_s and proc.poll() is None:
        if healthy(PORT):
            ready_at = time.monotonic()
            break
        time.sleep(0.5)
    time.sleep(3)  # the doctor prints and records its comparison after its own /health 200
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    gpu_free(60)  # the next run's gate (gpu.idle) must not see this server's memory
    text = log.read_text(errors="replace")
    exec_at = text.find("k26-doctor: exec:")
    record = state / "start" / "last.json"
    entry = json.loads(record.read_text()) if record.exists() else None
    if record.exists():
        record.rename(state / "start" / f"{name}.json")
    total = None if ready_at is None else round(ready_at - started, 1)
    out_row = {"run": name, "launch_to_healthy_s": total, "healthy": ready_at is not None,
               "log": log.name, "exec_seen": exec_at >= 0}
    if entry:
        out_row.update(predicted_s=entry["plan"]["total_s"], server_ready_after_s=entry["ready_after_s"],
                       prediction_ratio=round(entry["plan"]["total_s"] / entry["ready_after_s"], 3),
                       comparison=entry["comparison"], prewarm=entry.get("prewarm"), plan=entry["plan"],
                       actual=entry["actual"]["parts"])
    return out_row


def gpu_free(limit_s: float) -> bool:
    """Wait until no process holds a GPU (nvidia-smi's compute apps), at most ``limit_s``."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        res = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                             capture_output=True, text=True)
        if res.returncode == 0 and not res.stdout.strip():
            return True
        time.sleep(1)
    return False


def fresh_caches(root: Path) -> dict[str, str]:
    shutil.rmtree(root, ignore_errors=True)
    (root / "flashinfer").mkdir(parents=True)
    (root / "triton").mkdir(parents=True)
    return {"FLASHINFER_WORKSPACE_BASE": str(root / "flashinfer"), "TRITON_CACHE_DIR": str(root / "triton")}


# -- a random DeepSeek-V3 checkpoint large enough that loading shows --------------------------------------------

def write_big_dsv3(out: Path, gib: float, seconds: float) -> dict:
    """A DeepSeek-V3 (MLA + MoE) of about ``gib`` GiB as real safetensors shards with random bf16 values: the
    tensor names and shapes of transformers' DeepseekV3ForCausalLM (built on the meta device: no memory), the
    layer count chosen to reach the size, the data one random 64 MiB block repeated (the load reads every byte;
    what they are does not matter to its time). Stops at ``seconds`` (the checkpoint stays consistent: the
    layer count is fixed first)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    def config(layers: int) -> DeepseekV3Config:
        return DeepseekV3Config(vocab_size=32000, hidden_size=2048, intermediate_size=8192, moe_intermediate_size=1024,
                                num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
                                n_shared_experts=1, n_routed_experts=64, num_experts_per_tok=6, n_group=1,
                                topk_group=1, routed_scaling_factor=1.0, first_k_dense_replace=1, q_lora_rank=512,
                                kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                                max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=False,
                                torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                rope_scaling=None)

    def shapes(layers: int) -> dict:
        with torch.device("meta"):
            model = DeepseekV3ForCausalLM(config(layers))
        return {k: tuple(v.shape) for k, v in model.state_dict().items()}

    per_layer = sum(2 * _numel(s) for k, s in shapes(3).items() if ".layers.2." in k)
    fixed = sum(2 * _numel(s) for k, s in shapes(3).items() if ".layers." not in k)
    layers = max(2, int((gib * 1024**3 - fixed) // per_layer))
    names = shapes(layers)
    out.mkdir(parents=True, exist_ok=True)
    block = os.urandom(64 << 20)
    shard_limit, shard, shard_bytes, index, files = 4 << 30, [], 0, {}, []
    started = time.monotonic()

    def flush() -> None:
        nonlocal shard, shard_bytes
        if not shard:
            return
        name = f"model-{len(files) + 1:05d}.safetensors"
        _write_shard(out / name, shard, block)
        files.append(name)
        index.update({k: name for k, _ in shard})
        shard, shard_bytes = [], 0

    for key, shape in names.items():
        size = 2 * _numel(shape)
        if shard_bytes + size > shard_limit:
            flush()
            if time.monotonic() - started > seconds:
                raise SystemExit(f"writing the checkpoint passed {seconds:.0f} s: give --big-gib less")
        shard.append((key, shape))
        shard_bytes += size
    flush()
    total = sum((out / f).stat().st_size for f in files)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": index}))
    cfg = config(layers).to_dict()
    cfg.update({"architectures": ["DeepseekV3ForCausalLM"], "moe_layer_freq": 1, "topk_method": "noaux_tc",
                "scoring_func": "sigmoid", "ep_size": 1, "num_nextn_predict_layers": 0})
    (out / "config.json").write_text(json.dumps(cfg, indent=1, default=str))
    return {"path": str(out), "layers": layers, "bytes": total, "shards": len(files),
            "write_s": round(time.monotonic() - started, 1)}


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _write_shard(path: Path, tensors: list, block: bytes) -> None:
    header, offset = {}, 0
    for key, shape in tensors:
        size = 2 * _numel(shape)
        header[key] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as fh:
        fh.write(len(head).to_bytes(8, "little") + head)
        left = offset
        while left > 0:
            n = min(left, len(block))
            fh.write(block[:n])
            left -= n
        fh.flush()
        os.fsync(fh.fileno())


def drop_pages(folder: Path) -> dict:
    """Drop the shards' pages (clean after fsync) and say how much stays resident (mincore)."""
    from doctor.model.residency import Residency, model_residency

    for f in folder.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return model_residency(str(folder), Residency())


def big_profile(out: Path, model: Path, base: Path) -> Path:
    """The trained pair's profile for a target alone: no speculative decoding, the big model's path."""
    text = base.read_text()
    text = text.replace('speculative_algorithm = "DDTREE"\n', "").replace("ddtree_budget = 16\n", "")
    text = re.sub(r'(?m)^(\[model\]\npath = )"[^"]*"', lambda m: f'{m.group(1)}"{model}"', text)
    text = text.replace("num_hidden_layers = 4\n", "").replace("hidden_size = 256\n", "").replace(
        "vocab_size = 64\n", "")
    text = re.sub(r'(?m)^\[drafter\]\npath = "[^"]*"\narchitectures = \["DFlashDraftModel"\]\n', "", text)
    text = re.sub(r"(?m)^mem_fraction_static = .*$", "mem_fraction_static = 0.6", text)  # the weights and a KV cache
    path = out / "profile-big.toml"
    path.write_text(text.replace('name = "h200-trained-ddtree"', 'name = "h200-big-dsv3"'))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="cold,warm")
    ap.add_argument("--profile", default=str(PROFILE), help="the trained pair's profile (gpu_session.sh points it)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/start-plan-out"))
    ap.add_argument("--root", default="/tmp/k26-start-bench")
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole call")
    ap.add_argument("--limit", type=float, default=400, help="seconds one start may take")
    ap.add_argument("--big-gib", type=float, default=40)
    ap.add_argument("--big-seconds", type=float, default=150, help="most seconds writing the checkpoint may take")
    ns = ap.parse_args()
    began = time.monotonic()
    out, root = Path(ns.out), Path(ns.root)
    out.mkdir(parents=True, exist_ok=True)
    state = root / "state"
    caches = root / "caches"
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    results: dict = {"runs": [], "host": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                                          "--format=csv,noheader"], capture_output=True,
                                                         text=True).stdout.strip()}
    cache_env: dict[str, str] = {}
    big = root / "big-dsv3"
    for run in [r for r in ns.runs.split(",") if r]:
        left = ns.budget - (time.monotonic() - began)
        if left < 60:
            results["runs"].append({"run": run, "skipped": f"{left:.0f} s left of the budget"})
            continue
        extra: list[str] = []
        profile = Path(ns.profile)
        if run in ("cold", "cold-prewarm", "big-cold") or not cache_env:
            cache_env = fresh_caches(caches)
        if run == "cold":
            extra.append("--no-prewarm")
        if run.startswith("big"):
            if not (big / "config.json").exists():
                results["big_model"] = write_big_dsv3(big, ns.big_gib, ns.big_seconds)
            profile = big_profile(out, big, Path(ns.profile))
            if run == "big-cold":
                results.setdefault("dropped", drop_pages(big))
        row = launch(run, profile, {**env, **cache_env}, state, out, extra, min(ns.limit, left - 30))
        results["runs"].append(row)
        print(json.dumps({k: row.get(k) for k in ("run", "launch_to_healthy_s", "predicted_s",
                                                   "server_ready_after_s", "prediction_ratio")}), flush=True)
        (out / "start-plan.json").write_text(json.dumps(results, indent=1, default=str))
    by = {r["run"]: r for r in results["runs"] if r.get("launch_to_healthy_s")}
    for cold, warm in (("cold", "warm"), ("cold-prewarm", "warm"), ("big-cold", "big-warm")):
        if cold in by and warm in by:
            results[f"{cold}/{warm}"] = round(by[cold]["launch_to_healthy_s"] / by[warm]["launch_to_healthy_s"], 3)
    (out / "start-plan.json").write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps({k: v for k, v in results.items() if "/" in k}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
