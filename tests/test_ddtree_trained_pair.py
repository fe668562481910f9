"""The trained DDTree pair (bench/ddtree/make_trained.py): its language, a miniature build (determinism, the
checkpoint layouts SGLang and transformers load), the drafter's SGLang conventions, the tree-verify
simulation and the report's computed claims."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import math
import random
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("transformers") is None:  # found, not imported: collection would pay 2.6 s for it
    pytest.skip("could not import 'transformers'", allow_module_level=True)
pytest.importorskip("safetensors")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "ddtree"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures" / "model"))
import make_trained as mt  # noqa: E402
import pair_models as pm  # noqa: E402
import pair_report  # noqa: E402
import sglang_wheels  # noqa: E402
import specsim  # noqa: E402
import synthlang  # noqa: E402
from conftest import run_doctor  # noqa: E402
from ddtree_support import patched_tree  # noqa: E402
from model_replica import K26Spec, k26_tensors  # noqa: E402
from safetensors import safe_open  # noqa: E402

LANG = synthlang.build(0)


def hashes(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pair") / "pair"
    mt.build(out, seed=0, device="cpu", recipe_name="mini")
    return out


@pytest.fixture(scope="module")
def report(built: Path) -> dict:
    return pair_report.write_report(built, "cpu")


# -- the language ---------------------------------------------------------------------------------------


def test_language_is_a_function_of_its_seed():
    assert synthlang.build(0).to_json() == LANG.to_json()
    assert synthlang.build(1).sha256() != LANG.sha256()
    assert synthlang.Language.from_json(json.loads(json.dumps(LANG.to_json()))) == LANG


def test_texts_parse_and_distributions_are_exact():
    rng = random.Random(5)
    for _ in range(50):
        text = LANG.sample(rng, 120)
        assert LANG.mask_token not in text and synthlang.EOS not in text
        dists = LANG.next_distributions(text)
        for i, dist in enumerate(dists[:-1]):
            assert math.isclose(sum(dist.values()), 1.0)
            assert dist.get(text[i + 1], 0) > 0, "a sampled token had no mass"
            assert LANG.conditional(text[:i + 1]) == dist
    assert LANG.parse([synthlang.BOS, LANG.topic_token(0), LANG.mask_token]) is None
    assert LANG.conditional([synthlang.BOS, 99]) is None and LANG.conditional([5, 3, 7]) is None


def test_branch_points_have_clear_margins_and_most_positions_are_certain():
    rng = random.Random(6)
    certain = total = 0
    for _ in range(40):
        text = LANG.sample(rng, 200)
        for dist in LANG.next_distributions(text)[2:]:
            total += 1
            probs = sorted(dist.values(), reverse=True)
            if len(probs) == 1:
                certain += 1
                continue
            assert probs[0] - probs[1] >= 0.1 - 1e-9 and math.log(probs[0] / probs[1]) >= 0.2, probs
            if len(probs) > 2:
                assert probs[1] - probs[2] >= 0.15 - 1e-9
    assert 0.6 < certain / total < 0.95


def _contexts(lang, n_ctx: int):
    """{(topic, last n_ctx tokens): set of next-token distributions} over many texts."""
    rng = random.Random(7)
    seen: dict = {}
    for _ in range(200):
        text = lang.sample(rng, 100)
        for i, dist in enumerate(lang.next_distributions(text)):
            if i >= 2 + n_ctx:
                seen.setdefault((text[1], tuple(text[i - n_ctx + 1:i + 1])), set()).add(tuple(sorted(dist.items())))
    return seen


def test_next_token_depends_on_the_previous_token_and_the_topic():
    one = _contexts(LANG, 1)
    assert sum(len(v) > 1 for v in one.values()) >= 10  # same topic and current token, different futures
    two = _contexts(LANG, 2)
    by_tokens: dict = {}
    for (topic, toks), dists in two.items():
        by_tokens.setdefault(toks, {})[topic] = dists
    differs = [t for t, per in by_tokens.items() if len(per) > 1 and len({frozenset(d) for d in per.values()}) > 1]
    assert len(differs) >= 5  # the same two tokens continue differently under another topic


def test_drafter_marginals_put_their_argmax_off_the_greedy_path():
    """At flip motifs the per-position marginal's argmax is not the greedy path's token: a chain is cut where
    a tree holding the runner-up is not, under greedy decoding too."""
    off = 0
    for topic in range(LANG.n_topics):
        for phrase, _ in LANG.entries(topic):
            tokens = [synthlang.BOS, LANG.topic_token(topic), LANG.phrases[phrase][0]]
            greedy = LANG.greedy(tokens, 60)
            for start in range(0, 50):
                state = LANG.parse(tokens + greedy[:start])
                marg = LANG.marginals(state, 7)
                off += any(max(m, key=m.get) != greedy[start + d] for d, m in enumerate(marg))
    assert off > 0
    flips = [m for m, (kind, _) in enumerate(LANG.motifs) if kind == "flip"]
    assert all(any(m in flips for m in cycle) for cycle in LANG.cycles)


def test_prompt_sets():
    greedy = synthlang.prompts(LANG, 40, "greedy", seed=3)
    assert greedy == synthlang.prompts(LANG, 40, "greedy", seed=3) != synthlang.prompts(LANG, 40, "greedy", seed=4)
    assert all(8 <= len(p) <= 128 and LANG.parse(p) is not None for p in greedy)
    assert len({len(p) for p in greedy}) > 20
    sampled = synthlang.prompts(LANG, 30, "sampled", seed=3)
    for p in sampled:
        state = LANG.parse(p)
        marg = LANG.marginals(state, 5)
        assert sorted(marg[0].values(), reverse=True) == list(synthlang.FORK)
        # every one of the first five positions has several categories with real mass
        assert all(sum(v >= 0.1 for v in m.values()) >= 2 for m in marg), marg
    with pytest.raises(ValueError):
        synthlang.prompts(LANG, 1, "beam", seed=0)


def test_router_training_terms():
    """The hinge reads the k-th minus the (k+1)-th *biased* score; the load term is 0 for a uniform load and
    E - 1 when every token picks the same experts."""
    choice = torch.tensor([[0.9, 0.8, 0.3, 0.1], [0.2, 0.7, 0.65, 0.6]])
    r = pm.Routing(logits=torch.zeros(2, 4), choice=choice, experts=torch.topk(choice, 2).indices)
    assert torch.allclose(mt.router_gaps(r, 2), torch.tensor([0.5, 0.05]))
    spread = torch.eye(4).repeat(25, 1)
    assert abs(float(mt.balance_loss(pm.Routing(spread, spread, spread[:, :2].long()), 4))) < 1e-6
    same = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(100, 1)
    assert math.isclose(float(mt.balance_loss(pm.Routing(same, same, same[:, :2].long()), 4)), 3.0, rel_tol=1e-4)


def test_decision_margin_loss():
    """The hinge reads top-1 of the exact distribution against the best other logit, with the branch floor where
    the distribution has several tokens and the certain floor where it has one; a met floor costs nothing."""
    tgt = torch.tensor([[[0.0, 0.55, 0.45], [0.0, 0.0, 1.0]]])
    met = torch.tensor([[[0.0, 1.0, 0.4], [0.0, -1.0, 3.5]]])  # margins 0.6 >= 0.5 and 3.5 >= 3.0
    assert float(mt.decision_margin_loss(met, tgt, 0.5, 3.0)) == 0.0
    short = torch.tensor([[[0.0, 1.0, 0.9], [0.0, 1.0, 2.0]]])  # margins 0.1 and 1.0: 0.4 and 2.0 short
    assert math.isclose(float(mt.decision_margin_loss(short, tgt, 0.5, 3.0)), (0.4 + 2.0) / 2, rel_tol=1e-5)
    wrong = torch.tensor([[[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]])  # the runner-up on top: a negative margin
    assert float(mt.decision_margin_loss(wrong, tgt, 0.5, 3.0)) > 1.5


def test_prompts_cli(tmp_path: Path):
    out = tmp_path / "p.json"
    assert mt.main(["--prompts", "12", "--kind", "sampled", "--seed", "9", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "sampled" and data["language_sha256"] == LANG.sha256()
    assert data["prompts"] == synthlang.prompts(LANG, 12, "sampled", seed=9)


# -- the build --------------------------------------------------------------------------------------------


def test_build_is_deterministic(built: Path, tmp_path: Path):
    again = tmp_path / "again"
    mt.build(again, seed=0, device="cpu", recipe_name="mini")
    saved = {k: v for k, v in hashes(built).items() if k != "report.json"}
    assert hashes(again) == saved
    info = json.loads((built / "build.json").read_text())
    assert info["files"] == {k: v for k, v in hashes(built).items() if k not in ("build.json", "report.json")}
    other = tmp_path / "other"
    mt.build(other, seed=1, device="cpu", recipe_name="mini")
    assert hashes(other)["dsv3/model.safetensors"] != hashes(built)["dsv3/model.safetensors"]


def tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    with safe_open(str(path), "pt") as f:
        return {k: (str(f.get_slice(k).get_dtype()), tuple(f.get_slice(k).get_shape())) for k in f.keys()}


def test_target_layout_is_k26s_text_path(built: Path):
    """Every tensor of Kimi K2.6's published text layout (tests/model_replica.py, at this scale; experts
    unquantized) is in the checkpoint with its shape, and nothing else is; transformers loads it whole."""
    from transformers import DeepseekV3ForCausalLM

    got = tensors(built / "dsv3" / "model.safetensors")
    s = pm.TargetShape()
    spec = K26Spec(num_hidden_layers=s.layers, n_routed_experts=s.experts, hidden_size=s.hidden,
                   intermediate_size=s.intermediate, moe_intermediate_size=s.moe_intermediate,
                   num_attention_heads=s.heads, q_lora_rank=s.q_lora, kv_lora_rank=s.kv_lora,
                   qk_nope_head_dim=s.nope_dim, qk_rope_head_dim=s.rope_dim, v_head_dim=s.v_dim, vocab_size=s.vocab,
                   num_experts_per_tok=s.experts_per_tok, vision_layers=0)
    want = {}
    for group in k26_tensors(spec):
        for name, _dtype, shape in group:
            if not name.startswith(spec.prefix):
                continue
            name = name[len(spec.prefix):]
            if ".experts." in name and not name.endswith(".weight_packed"):
                continue  # the int4 scales and shapes of the quantized experts
            if name.endswith(".weight_packed"):
                name, shape = name[:-len("_packed")], None
            want[name] = shape
    assert set(got) == set(want)
    for name, shape in want.items():
        if shape is not None:
            assert got[name][1] == shape, name
    assert got["model.layers.1.mlp.experts.3.gate_proj.weight"][1] == (s.moe_intermediate, s.hidden)
    assert {dtype for dtype, _ in got.values()} == {"BF16"}
    _, info = DeepseekV3ForCausalLM.from_pretrained(built / "dsv3", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    cfg = json.loads((built / "dsv3" / "config.json").read_text())
    assert {k: cfg[k] for k in ("topk_method", "scoring_func", "n_group", "topk_group", "kv_lora_rank",
                                "num_nextn_predict_layers", "first_k_dense_replace", "n_routed_experts",
                                "num_experts_per_tok", "n_shared_experts", "moe_layer_freq", "rope_interleave")} == {
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "n_group": 1, "topk_group": 1, "kv_lora_rank": 512,
        "num_nextn_predict_layers": 0, "first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "moe_layer_freq": 1, "rope_interleave": True}
    with safe_open(str(built / "dsv3" / "model.safetensors"), "pt") as f:
        bias = f.get_tensor("model.layers.2.mlp.gate.e_score_correction_bias")
    assert bias.abs().min() > 0 and bias.abs().max() <= mt.ROUTER_BIAS_SPAN / 2


def wheel_source(path: str) -> str:
    with zipfile.ZipFile(sglang_wheels.wheel_for("0.5.23")) as zf:
        return zf.read(path).decode()


@pytest.mark.network  # reads the released SGLang 0.5.23 wheel (a first-run download)
def test_drafter_layout_is_what_dflash_load_weights_consumes(built: Path):
    """The drafter's tensors against SGLang 0.5.23's ``DFlashDraftModel.load_weights``: every checkpoint name
    goes through its ``stacked_params_mapping`` (read from the wheel) or names one of the module's own
    parameters, and ``fc`` takes ``len(target_layer_ids)`` hidden states."""
    src = wheel_source("sglang/srt/models/dflash.py")
    tree = ast.parse(src)
    load = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "load_weights"
                and "stacked_params_mapping" in ast.unparse(n))
    mapping = next(ast.literal_eval(a.value) for a in ast.walk(load)
                   if isinstance(a, ast.Assign) and ast.unparse(a.targets[0]) == "stacked_params_mapping")
    got = tensors(built / "dsv3-dflash" / "model.safetensors")
    cfg = json.loads((built / "dsv3-dflash" / "config.json").read_text())
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv, hd, inter = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], \
        cfg["intermediate_size"]
    # The module's own parameters (DFlashDraftModel / DFlashDecoderLayer / DFlashAttention / DFlashMLP).
    own = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(layers):
        p = f"layers.{i}."
        own |= {p + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                "self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                                "self_attn.k_norm.weight",
                                "mlp.gate_up_proj.weight", "mlp.down_proj.weight")}
    for attr in ("self.fc", "self.hidden_norm", "self.norm", "self.qkv_proj", "self.o_proj", "self.q_norm",
                 "self.k_norm", "self.gate_up_proj", "self.down_proj", "self.input_layernorm",
                 "self.post_attention_layernorm"):
        assert f"{attr} =" in src, attr
    loaded = set()
    for name in got:
        for param, weight, _shard in mapping:
            if f".{weight}." in name:
                loaded.add(name.replace(weight, param))
                break
        else:
            loaded.add(name)
    assert loaded == own
    shapes = {k: v[1] for k, v in got.items()}
    ids = cfg["dflash_config"]["target_layer_ids"]
    assert shapes["fc.weight"] == (h, h * len(ids))
    assert shapes["layers.0.self_attn.q_proj.weight"] == (heads * hd, h)
    assert shapes["layers.0.self_attn.k_proj.weight"] == (kv * hd, h)
    assert shapes["layers.1.mlp.gate_proj.weight"] == (inter, h)
    assert shapes["layers.0.self_attn.q_norm.weight"] == (hd,)
    assert cfg["dflash_config"] == {"block_size": 8, "mask_token_id": 63, "target_layer_ids": [1, 2]}
    assert cfg["architectures"] == ["DFlashDraftModel"] and "layer_types" not in cfg  # ENCODER_ONLY layers
    target = json.loads((built / "dsv3" / "config.json").read_text())
    assert max(ids) + 1 < target["num_hidden_layers"]  # capture point id + 1 is a layer's input


def test_product_model_checks_pass_on_the_pair(built: Path):
    """k26-doctor's own model.config and model.drafter judge the pair consistent (its profile)."""
    profile = ROOT / "bench" / "ddtree" / "profiles" / "h200-trained-ddtree.toml"
    proc = run_doctor("check", "--profile", str(profile), "--model-path", str(built / "dsv3"),
                      "--draft-model-path", str(built / "dsv3-dflash"), "--only", "model.config", "--only",
                      "model.drafter", "--only", "model.shards", "--format", "json")
    data = json.loads(proc.stdout)
    status = {r["id"]: r["status"] for r in data["results"]}
    assert status == {"model.config": "pass", "model.drafter": "pass", "model.shards": "pass"}, proc.stdout[-3000:]


# -- the models' conventions --------------------------------------------------------------------------------


def reference_block(d: pm.DFlashDrafter, feats, ctx_pos, embeds, block_pos, causal=False, ctx_shift=0):
    """SGLang's DFlash draft forward written out op by op in float64 (dflash.py / dflash_worker_v2.py):
    context K/V = rope(k_norm(W_k hidden_norm(fc(feats)))), V = W_v ctx, at the context positions; block
    tokens attend to every context slot and (ENCODER_ONLY) every block token."""
    s = d.shape
    sd = {k: v.double() for k, v in d.state_dict().items()}

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * w

    def rope(x, pos):  # neox: rotate halves; x [n, heads, hd]
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float64) / s.head_dim))
        f = pos.double()[:, None, None] * inv
        x1, x2 = x[..., : s.head_dim // 2], x[..., s.head_dim // 2:]
        return torch.cat([x1 * f.cos() - x2 * f.sin(), x2 * f.cos() + x1 * f.sin()], -1)

    ctx = rms(feats.double() @ sd["fc.weight"].T, sd["hidden_norm.weight"])
    x = embeds.double()
    nb = x.shape[0]
    for i in range(s.layers):
        p = f"layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = rms((h @ sd[p + "self_attn.q_proj.weight"].T).view(nb, s.heads, -1), sd[p + "self_attn.q_norm.weight"])
        kb = rms((h @ sd[p + "self_attn.k_proj.weight"].T).view(nb, s.kv_heads, -1), sd[p + "self_attn.k_norm.weight"])
        vb = (h @ sd[p + "self_attn.v_proj.weight"].T).view(nb, s.kv_heads, -1)
        kc = rms((ctx @ sd[p + "self_attn.k_proj.weight"].T).view(-1, s.kv_heads, s.head_dim),
                 sd[p + "self_attn.k_norm.weight"])
        vc = (ctx @ sd[p + "self_attn.v_proj.weight"].T).view(-1, s.kv_heads, s.head_dim)
        q, kb, kc = rope(q, block_pos), rope(kb, block_pos), rope(kc, ctx_pos + ctx_shift)
        k = torch.cat([kc, kb]).repeat_interleave(s.heads // s.kv_heads, 1)
        v = torch.cat([vc, vb]).repeat_interleave(s.heads // s.kv_heads, 1)
        w = torch.einsum("qhd,khd->hqk", q, k) * s.head_dim ** -0.5
        if causal:
            blocked = torch.ones(nb, nb, dtype=torch.bool).triu(1)
            w[:, :, kc.shape[0]:] = w[:, :, kc.shape[0]:].masked_fill(blocked, float("-inf"))
        o = torch.einsum("hqk,khd->qhd", w.softmax(-1), v).reshape(nb, -1)
        x = x + o @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        g = h @ sd[p + "mlp.gate_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * (h @ sd[p + "mlp.up_proj.weight"].T)) @ sd[p + "mlp.down_proj.weight"].T
    return rms(x, sd["norm.weight"])


def test_drafter_block_matches_sglangs_forward_and_is_not_causal(built: Path):
    target = mt.load_target(built)
    drafter = mt.load_drafter(built)
    text = LANG.sample(random.Random(1), 30)
    p = 17  # the root: context positions 0..16, block positions 17..24
    with torch.no_grad():
        feats = target.context_features(target(torch.tensor([text])), [1, 2])[0]
        ids = torch.tensor([[text[p]] + [63] * 7])
        embeds = target.model.embed_tokens(ids)
        positions = torch.arange(p, p + 8)[None]
        ctx = drafter.project(feats[None])
        ctx_kv = drafter.context_kv(ctx, torch.arange(len(text))[None])
        allowed = pm.block_allowed(torch.tensor([len(text)]), len(text), torch.tensor([[p]]), 8)
        got = drafter(embeds, positions, ctx_kv, allowed)[0].double()
    ref = reference_block(drafter, feats[:p], torch.arange(p), embeds[0], positions[0])
    assert (got - ref).abs().max() < 1e-4
    # The reference would tell a causal block or shifted context positions apart.
    assert (reference_block(drafter, feats[:p], torch.arange(p), embeds[0], positions[0], causal=True)[:7]
            - ref[:7]).abs().max() > 1e-3
    assert (reference_block(drafter, feats[:p], torch.arange(p), embeds[0], positions[0], ctx_shift=1)
            - ref).abs().max() > 1e-3
    # And the block reads its later (mask) tokens: changing the last one changes the first prediction.
    with torch.no_grad():
        other = target.model.embed_tokens(torch.tensor([[text[p]] + [63] * 6 + [7]]))
        moved = drafter(other, positions, ctx_kv, allowed)[0].double()
    assert (moved[1] - got[1]).abs().max() > 1e-4


def test_context_features_are_the_residual_stream_after_layer_id(built: Path):
    """``hidden_states[id + 1]`` of transformers' forward = SGLang's capture at layer id + 1 (its input)."""
    from transformers import DeepseekV3ForCausalLM

    hf = DeepseekV3ForCausalLM.from_pretrained(built / "dsv3", dtype=torch.float32).eval()
    target = mt.load_target(built)
    x = torch.tensor([LANG.sample(random.Random(2), 20)])
    with torch.no_grad():
        ref = hf(input_ids=x, output_hidden_states=True)
        own = target(x)
        captured = []
        hook = hf.model.layers[2].register_forward_pre_hook(lambda _m, args, kw: captured.append(
            (args[0] if args else kw["hidden_states"]).clone()), with_kwargs=True)
        hf(input_ids=x)
        hook.remove()
    feats = target.context_features(own, [1, 2])
    assert (feats[..., :256] - captured[0]).abs().max() < 1e-5  # entering layer 2 = after layer 1
    assert (feats[..., 256:] - ref.hidden_states[3]).abs().max() < 1e-5
    assert (own.logits - ref.logits).abs().max() < 1e-4


def test_tree_verify_equals_plain_forward_of_each_path(built: Path):
    """The simulation's tree forward (committed slots + ancestors, positions prefix + depth): each node's
    logits are those of a plain causal forward of the prompt plus the node's path."""
    dd = specsim.load_ddtree_utils()
    target = mt.load_target(built)
    prompts = [LANG.sample(random.Random(i), 10 + 7 * i) for i in range(2)]
    sess = specsim.Session(target, prompts, [1, 2])
    g = torch.Generator().manual_seed(0)
    trees = []
    for _ in prompts:
        lp, tk = dd.ddtree_topk_from_logits(torch.randn(7, 64, generator=g), 4)
        trees.append(dd.build_ddtree(lp, tk, 12, 9))  # any root token
    enc = dd.encode_eagle(trees, prefix_lens=sess.n)
    with torch.no_grad():
        out = sess.forward(enc.draft_tokens, enc.positions.view(2, -1), enc.tree_mask)
        for b, (p, tree) in enumerate(zip(prompts, trees, strict=True)):
            for node in range(tree.size):
                seq = p + [tree.tokens[i] for i in tree.path(node)]
                plain = target(torch.tensor([seq])).logits[0, -1]
                assert (plain - out.logits[b, node]).abs().max() < 1e-4


@pytest.mark.network  # reads the released SGLang 0.5.23 wheel (a first-run download)
def test_ddtree_utils_rebuilt_from_the_patch_is_the_patched_file():
    dd = specsim.load_ddtree_utils()
    assert Path(dd.__file__).read_bytes() == (patched_tree() / specsim.UTILS_PATH).read_bytes()


# -- the report ---------------------------------------------------------------------------------------------


def test_simulated_speculative_decoding_is_lossless_for_any_drafter(report: dict):
    """Greedy DFLASH and DDTREE reproduce the target's own greedy decoding even with the miniature's
    untrained drafter (accept lengths are then near 1): the tree mask, positions and KV commit are right."""
    runs = report["speculative"]["runs"]
    n = report["speculative"]["prompts"]
    greedy = {k: r for k, r in runs.items() if r["temperature"] == 0.0}
    assert set(greedy) == {"DFLASH@T0", "DDTREE-16@T0", "DDTREE-32@T0", "DDTREE-64@T0"}
    assert all(r["identical_to_target_greedy"] == n for r in greedy.values())
    assert report["claims"]["simulated_greedy_lossless"]["holds"]


def test_report_figures_are_consistent_and_claims_computed(report: dict, built: Path):
    on_disk = json.loads((built / "report.json").read_text())
    assert on_disk["claims"] == report["claims"] == pair_report.judge(on_disk)
    for r in report["speculative"]["runs"].values():
        hist = {int(k): v for k, v in r["committed_per_round_histogram"].items()}
        assert sum(hist.values()) == r["rounds"] and sum(k * v for k, v in hist.items()) == r["committed"]
        assert math.isclose(r["accept_length"], r["committed"] / r["rounds"], rel_tol=1e-3)
        assert 1 <= min(hist) and max(hist) <= 8
    # Claims follow the figures: make DDTREE-32 no better than DFLASH and the claim turns false.
    changed = json.loads(json.dumps(on_disk))
    runs = changed["speculative"]["runs"]
    runs["DDTREE-32@T0"]["accept_length"] = runs["DFLASH@T0"]["accept_length"]
    assert not pair_report.judge(changed)["ddtree_beats_dflash_every_budget@T0"]["holds"]
    for r in runs.values():
        if r["temperature"] == 0.0:
            r["accept_length"] = runs["DFLASH@T0"]["accept_length"] * (1.2 if r["algo"] != "DFLASH" else 1)
    assert pair_report.judge(changed)["ddtree_beats_dflash_every_budget@T0"]["holds"]
    changed["target"]["routing"]["expert_choice_flips_total"] = 1
    assert not pair_report.judge(changed)["no_expert_flips_bf16_vs_fp32"]["holds"]
    t = report["target"]
    assert set(t["routing"]["layers"]) == {"1", "2", "3"}
    for layer in t["routing"]["layers"].values():
        assert layer["gap_2nd_3rd_biased_score"]["n"] == t["routing"]["tokens"]
        assert math.isclose(sum(layer["expert_load"]), 2.0, rel_tol=1e-3)
    assert t["transformers_agreement"]["max_abs_logit_diff"] < 1e-3
