"""``python -m sglang.launch_server ARGS``: a fake SGLang server for the sequencing tests (not for the criteria:
those are tested on data that can fail, tests/test_validate_criteria.py).

The "model": vocabulary 50; the greedy token after a context is a hash of it; the top log-probabilities put the
greedy token at -0.5 and a runner-up at -0.55 (a near-tie) or -4.0. Sampling draws from softmax(logits / T) over
four tokens. Speculative servers (DFLASH, DDTREE) emit exactly the same tokens (lossless) and report
``spec_verify_ct`` with accept lengths 2.0 (DFLASH) and 2.0 + budget / 32 (DDTREE); each verify round sleeps
``FAKE_SGLANG_ROUND_S``. ``FAKE_SGLANG_FAULTS="ddtree-32:diverge,dflash:never-healthy"`` gives a role a fault:
diverge (greedy output leaves the base's at position 5 with a token outside its top-k), biased (sampled T
raised 60%), serves-refusals (answers requests DDTREE cannot serve exactly), never-healthy (/health 503),
exit-after-N (the process exits after N generate requests), crash-at-start (exits at once).
"""

import argparse
import hashlib
import json
import math
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VOCAB = 50


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--speculative-algorithm", default=None)
    ap.add_argument("--speculative-ddtree-budget", type=int, default=None)
    args, _ = ap.parse_known_args()
    return args


ARGS = parse()
ALGO = (ARGS.speculative_algorithm or "").upper() or None
ROLE = "base" if ALGO is None else "dflash" if ALGO == "DFLASH" else f"ddtree-{ARGS.speculative_ddtree_budget}"
FAULTS = {}
for item in os.environ.get("FAKE_SGLANG_FAULTS", "").split(","):
    if ":" in item:
        role, fault = item.split(":", 1)
        FAULTS.setdefault(role, []).append(fault)
MINE = FAULTS.get(ROLE, [])
ROUND_S = float(os.environ.get("FAKE_SGLANG_ROUND_S", "0.0002"))
COUNT = {"n": 0}
LOCK = threading.Lock()


def greedy_next(ctx):
    return int(hashlib.sha256(repr(ctx).encode()).hexdigest()[:8], 16) % VOCAB


def top(ctx, pos):
    g = greedy_next(ctx)
    runner = (g + 1) % VOCAB
    return [[-0.5, g, None], [-0.55 if pos % 7 == 3 else -4.0, runner, None], [-6.0, (g + 2) % VOCAB, None]]


def sample(ctx, temperature, rng):
    base = greedy_next(ctx)
    logits = [2.0, 1.0, 0.5, 0.0]
    w = [math.exp(x / temperature) for x in logits]
    r = rng.random() * sum(w)
    for i, x in enumerate(w):
        r -= x
        if r <= 0:
            return (base + i) % VOCAB
    return (base + 3) % VOCAB


SEEDS = iter(range(1 << 62))  # each request's own seed, in arrival order (next() under the GIL: no two share one)


def generate(req):
    sp = req.get("sampling_params") or {}
    ids = req.get("input_ids")
    if ids is None:
        ids = [b % VOCAB for b in str(req.get("text", "")).encode()]
    if ALGO == "DDTREE" and "serves-refusals" not in MINE:
        if req.get("return_logprob") or req.get("return_routed_experts") or sp.get("json_schema") or \
                sp.get("regex") or sp.get("min_p") or sp.get("frequency_penalty") or sp.get("presence_penalty") \
                or (sp.get("repetition_penalty") not in (None, 1.0)):
            return 400, {"error": {"message": "DDTREE cannot serve this request exactly"}}
    n = int(sp.get("max_new_tokens", 16))
    t = float(sp.get("temperature", 0.0))
    if "biased" in MINE and t > 0:
        t *= 1.6
    # Seeded (the role, the temperature, the request's number): the same run draws the same samples, so a verdict on
    # them is the criteria's, never the luck of one run (an unseeded control could miss its rejection at n 300).
    rng = random.Random(f"{ALGO}:{t}:{next(SEEDS)}")
    ctx = list(ids)
    out, tops = [], []
    for pos in range(n):
        if t > 0:
            tok = sample(ctx, t, rng)
        else:
            tok = greedy_next(ctx)
            if "diverge" in MINE and pos == 5:
                tok = (tok + 7) % VOCAB
        if req.get("return_logprob"):
            tops.append(top(ctx, pos))
        out.append(tok)
        ctx.append(tok)
    accept = None if ALGO is None else 2.0 if ALGO == "DFLASH" else 2.0 + (ARGS.speculative_ddtree_budget or 0) / 32
    rounds = math.ceil(n / accept) if accept else n
    time.sleep(ROUND_S * rounds)
    meta = {"completion_tokens": n, "spec_verify_ct": rounds if accept else 0}
    if req.get("return_logprob"):
        meta["output_top_logprobs"] = tops
    return 200, {"output_ids": out, "meta_info": meta}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.startswith("/health"):
            self.reply(503 if "never-healthy" in MINE else 200, {})
        else:
            self.reply(404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path != "/generate":
            return self.reply(404, {})
        with LOCK:
            COUNT["n"] += 1
            n = COUNT["n"]
        for fault in MINE:
            if fault.startswith("exit-after-") and n > int(fault.rsplit("-", 1)[1]):
                os._exit(3)
        self.reply(*generate(body))


def main():
    print(f"fake sglang {ROLE} on {ARGS.port} pid {os.getpid()} faults {MINE}", flush=True)
    if "crash-at-start" in MINE:
        sys.exit(1)
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 256
    ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
