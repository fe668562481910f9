"""The criteria of ``k26-doctor validate`` (``doctor.sglang.validation.criteria``, also bench/ddtree/serve_check.py's)
on data that can fail: each criterion passes on lossless data and fails (or is undecided) on data made to break
it -- a divergence outside the near-tie band, a biased sampler, a control too weak to prove power, a refusal
served, a server that stops serving, DDTREE slower than DFLASH."""

from __future__ import annotations

import random

from doctor.sglang.validation import criteria as c


def greedy_outputs(n: int, length: int = 128, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000) for _ in range(length)] for _ in range(n)]


def phase(outputs, baseline, name="c1", errors=0):
    return {"name": name, "outputs": outputs, "baseline": baseline, "errors": errors}


def test_greedy_identical_passes():
    base = greedy_outputs(40)
    got = c.judge_greedy([phase([list(o) for o in base], base)], {})
    assert got["outcome"] == c.PASS and got["identical"] == 40


def test_a_divergence_that_is_a_near_tie_passes_one_that_is_not_fails():
    base = greedy_outputs(400)
    spec = [list(o) for o in base]
    spec[3][10] = base[3][10] + 1
    tie = {("c1", 3): {base[3][10]: -0.70, base[3][10] + 1: -0.75}}
    assert c.judge_greedy([phase(spec, base)], tie)["outcome"] == c.PASS
    wide = {("c1", 3): {base[3][10]: -0.1, base[3][10] + 1: -2.5}}
    got = c.judge_greedy([phase(spec, base)], wide)
    assert got["outcome"] == c.FAIL and got["not_near_ties"] == 1 and "not a near-tie" in got["why"]
    unprobed = c.judge_greedy([phase(spec, base)], {})
    assert unprobed["outcome"] == c.FAIL  # a divergence nobody probed is never a pass


def test_too_many_divergences_fail_even_as_near_ties():
    base = greedy_outputs(100)
    spec = [list(o) for o in base]
    ties = {}
    for i in range(2):
        spec[i][5] = base[i][5] + 1
        ties[("c1", i)] = {base[i][5]: -0.7, base[i][5] + 1: -0.72}
    got = c.judge_greedy([phase(spec, base)], ties)
    assert got["outcome"] == c.FAIL and "identical on 98.00%" in got["why"]


def test_greedy_errors_and_short_outputs():
    base = greedy_outputs(10)
    assert c.judge_greedy([phase(base, base, errors=1)], {})["outcome"] == c.FAIL
    short = greedy_outputs(10, length=20)
    assert c.judge_greedy([phase(short, short)], {})["outcome"] == c.UNDECIDED
    assert c.judge_greedy([], {})["outcome"] == c.UNDECIDED


def draws(n: int, weights: list[float], seed: int, positions: int = 4) -> list[list[int]]:
    rng = random.Random(seed)
    return [rng.choices(range(len(weights)), weights=weights, k=positions) for _ in range(n)]


def cells(subject, base, control):
    return ({"name": "ddtree", "tests": c.position_tests(subject, base, 4)},
            {"name": "control", "tests": c.position_tests(control, base, 4)})


def test_sampled_the_same_distribution_passes_with_a_powerful_control():
    w, w_hot = [0.5, 0.25, 0.15, 0.1], [0.35, 0.27, 0.21, 0.17]
    got = c.judge_sampled(*cells(draws(3000, w, 1), draws(3000, w, 2), draws(3000, w_hot, 3)))
    assert got["outcome"] == c.PASS, got["why"]
    assert got["control"]["rejected"] >= 1 and got["subject"]["rejected"] == 0


def test_a_biased_sampler_is_rejected():
    w, biased = [0.5, 0.25, 0.15, 0.1], [0.44, 0.28, 0.17, 0.11]
    got = c.judge_sampled(*cells(draws(3000, biased, 1), draws(3000, w, 2), draws(3000, [0.35, 0.27, 0.21, 0.17], 3)))
    assert got["outcome"] == c.FAIL and got["subject"]["rejected"] >= 1


def test_a_control_the_test_cannot_see_leaves_it_undecided():
    w = [0.5, 0.25, 0.15, 0.1]
    got = c.judge_sampled(*cells(draws(3000, w, 1), draws(3000, w, 2), draws(3000, w, 3)))
    assert got["outcome"] == c.UNDECIDED and "power control" in got["why"]


def test_too_few_samples_or_positions_are_undecided():
    w = [0.5, 0.25, 0.15, 0.1]
    few = c.judge_sampled(*cells(draws(300, w, 1), draws(300, w, 2), draws(300, [0.1, 0.2, 0.3, 0.4], 3)))
    assert few["outcome"] == c.UNDECIDED and "too few" in few["why"]
    one_token = [[7, 7, 7, 7]] * 3000  # a deterministic context: no informative position
    got = c.judge_sampled(*cells(one_token, one_token, draws(3000, w, 3)))
    assert got["outcome"] == c.UNDECIDED


def test_chi2_tail_against_known_values():
    assert abs(c.chi2_sf(3.841458820694124, 1) - 0.05) < 1e-9
    assert abs(c.chi2_sf(11.070497693516351, 5) - 0.05) < 1e-9
    assert c.chi2_sf(0.0, 3) == 1.0


def refusals(code=400, health=200):
    return [{"what": w, "code": code, "health_after": health} for w, _, _ in c.REFUSALS]


def test_refusals():
    assert c.judge_refusals(refusals(), True)["outcome"] == c.PASS
    served = refusals()
    served[0]["code"] = 200
    got = c.judge_refusals(served, True)
    assert got["outcome"] == c.FAIL and "return_logprob" in got["why"]
    assert c.judge_refusals(refusals(health=0), True)["outcome"] == c.FAIL
    assert c.judge_refusals(refusals(), False)["outcome"] == c.FAIL
    assert c.judge_refusals(refusals()[1:], True)["outcome"] == c.FAIL  # a kind not asked


def test_worth_and_the_outcome():
    fast = {"c1": {"tok_per_s": 120.0, "accept_len": 3.0}, "c32": {"tok_per_s": 900.0, "accept_len": 3.0}}
    dflash = {"c1": {"tok_per_s": 100.0, "accept_len": 2.5}, "c32": {"tok_per_s": 800.0, "accept_len": 2.5}}
    base = {"c1": {"tok_per_s": 50.0}, "c32": {"tok_per_s": 700.0}}
    worth = c.judge_worth(fast, dflash, base, "c32")
    assert worth["faster"] is True and worth["phases"]["c1"]["tok_per_s_vs_base"] == 2.4
    ok = {"outcome": c.PASS, "why": ""}
    assert c.outcome(ok, ok, ok, worth)["outcome"] == c.PASS
    slow = c.judge_worth({**fast, "c32": {"tok_per_s": 780.0, "accept_len": 3.0}}, dflash, base, "c32")
    got = c.outcome(ok, ok, ok, slow)
    assert got["outcome"] == c.NOT_FASTER and "DFLASH is the faster choice" in got["why"][0]
    assert c.outcome({"outcome": c.FAIL, "why": "x"}, ok, ok, worth)["outcome"] == c.FAIL
    assert c.outcome(ok, {"outcome": c.UNDECIDED, "why": "y"}, ok, worth)["outcome"] == c.UNDECIDED
    assert c.outcome(ok, ok, ok, c.judge_worth(fast, {}, base, "c32"))["outcome"] == c.UNDECIDED
    assert c.outcome(ok, ok, ok, worth, ["ddtree-16 never became healthy"])["outcome"] == c.FAIL
