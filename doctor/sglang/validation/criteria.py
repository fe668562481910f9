"""The criteria DDTree is held to inside a real server, in one place (``k26-doctor validate`` and
``bench/ddtree/serve_check.py`` both judge with these functions).

- **Greedy**: token-identical to the base server (no speculation) on at least ``GREEDY_SAME_MIN`` of the
  requests; every divergence a near-tie of the base server's own distribution at the first differing position
  (its top log-probabilities there: ``|logprob(base token) - logprob(speculative token)| < NEAR_TIE``); a
  divergence that cannot be probed counts against it.
- **Sampled**: a two-sample chi-square test of homogeneity against the base server at T > 0 at every generated
  position and on the joint of the first three, judged at a family-wise ``FAMILY_ALPHA`` (Bonferroni over every
  test). Its power is shown by a control of the same size that must be rejected (the base server at a perturbed
  temperature); a control not rejected, too few samples or too few informative positions leave it undecided.
- **Refusals**: every request kind DDTREE cannot serve exactly is answered with an error and the server still
  serves afterwards.
- **Worth**: accept length and tokens/s against DFLASH and against the base at c1 and at the profile's
  concurrency. Lossless but not faster than DFLASH at the profile's concurrency is an outcome of its own.

Everything here is a pure function of the measured data (lists of token ids, counts, seconds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

GREEDY_SAME_MIN = 0.995  # share of requests token-identical to the base server
NEAR_TIE = 0.1  # |delta logprob| at a divergence that makes it a near-tie of the base's distribution
FAMILY_ALPHA = 0.01  # family-wise error rate of the sampled tests (Bonferroni over every test of a run)
MIN_SAMPLED_N = 2000  # samples of one context on each side
MIN_INFORMATIVE = 3  # tests with at least one degree of freedom
JOINT_POSITIONS = 3  # the joint of the first positions: what a per-position test cannot see

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
NOT_FASTER = "lossless-not-faster"
OUTCOMES = (PASS, NOT_FASTER, FAIL, UNDECIDED)

REFUSALS: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("return_logprob", {"return_logprob": True}, {}),
    ("json_schema", {}, {"json_schema": '{"type": "object"}'}),
    ("regex", {}, {"regex": "[0-9]+"}),
    ("min_p", {}, {"min_p": 0.2, "temperature": 1.0}),
    ("frequency_penalty", {}, {"frequency_penalty": 0.5}),
    ("presence_penalty", {}, {"presence_penalty": 0.5}),
    ("repetition_penalty", {}, {"repetition_penalty": 1.2}),
    ("return_routed_experts", {"return_routed_experts": True}, {}),
)
"""Each request kind DDTREE cannot serve exactly: (name, request fields, sampling parameters)."""


# ---------------------------------------------------------------------------------------------------- statistics


def chi2_sf(x: float, df: int) -> float:
    """Upper tail of the chi-square distribution (regularised upper incomplete gamma Q(df/2, x/2))."""
    if x <= 0:
        return 1.0
    a, z = df / 2.0, x / 2.0
    if z < a + 1:  # series for P, then Q = 1 - P
        term = total = 1.0 / a
        n = a
        for _ in range(10000):
            n += 1
            term *= z / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - math.lgamma(a)))
    tiny = 1e-300  # continued fraction for Q (Lentz)
    b = z + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, h * math.exp(-z + a * math.log(z) - math.lgamma(a)))


def _cell(x: int, y: int, na: int, nb: int) -> float:
    tot = x + y
    ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
    return (x - ea) ** 2 / ea + (y - eb) ** 2 / eb


def chi2_two_sample(a: Sequence[Any], b: Sequence[Any], min_expected: float = 5.0) -> tuple[float, int]:
    """Two-sample chi-square test of homogeneity over the categories seen: (statistic, degrees of freedom).
    Categories whose pooled count is too small for the approximation are merged into one cell."""
    na, nb = len(a), len(b)
    if not na or not nb:
        return 0.0, 0
    ca: dict[Any, int] = {}
    cb: dict[Any, int] = {}
    for x in a:
        ca[x] = ca.get(x, 0) + 1
    for x in b:
        cb[x] = cb.get(x, 0) + 1
    frac = min(na, nb) / (na + nb)
    stat, df, rest_a, rest_b = 0.0, -1, 0, 0
    for c in sorted(set(ca) | set(cb), key=repr):
        x, y = ca.get(c, 0), cb.get(c, 0)
        if (x + y) * frac < min_expected:
            rest_a, rest_b = rest_a + x, rest_b + y
            continue
        stat += _cell(x, y, na, nb)
        df += 1
    if rest_a + rest_b:
        stat += _cell(rest_a, rest_b, na, nb)
        df += 1
    return stat, max(df, 0)


def position_tests(outputs: Sequence[Sequence[int] | None], baseline: Sequence[Sequence[int] | None],
                   positions: int) -> list[dict[str, Any]]:
    """The chi-square statistic at every generated position and on the joint of the first
    ``JOINT_POSITIONS`` of two samples of one context: ``[{"position", "chi2", "df", "n", "n_baseline"}]``."""
    tests: list[dict[str, Any]] = []
    for k in [*range(positions), "joint"]:
        if k == "joint":
            a = [tuple(o[:JOINT_POSITIONS]) for o in outputs if o and len(o) >= JOINT_POSITIONS]
            b = [tuple(o[:JOINT_POSITIONS]) for o in baseline if o and len(o) >= JOINT_POSITIONS]
        else:
            a = [o[k] for o in outputs if o and len(o) > k]
            b = [o[k] for o in baseline if o and len(o) > k]
        stat, df = chi2_two_sample(a, b)
        tests.append({"position": k if k != "joint" else f"joint0-{JOINT_POSITIONS - 1}", "chi2": round(stat, 3),
                      "df": df, "n": len(a), "n_baseline": len(b)})
    return tests


def judge_cells(cells: Sequence[Mapping[str, Any]], family_alpha: float = FAMILY_ALPHA,
                min_n: int = MIN_SAMPLED_N) -> list[dict[str, Any]]:
    """Each cell (``{"name", "tests": position_tests(...), "control": bool}``) judged at the Bonferroni level
    over every informative test of every cell: ``rejected`` (how many), ``consistent`` (none rejected),
    ``enough`` (samples and informative positions to decide) and ``outcome``: a subject cell passes when none of
    its tests is rejected, fails when one is; a control cell passes when one is (the test has the power to see a
    difference of that size); either is undecided without enough data."""
    n_tests = max(1, sum(1 for c in cells for t in c["tests"] if t["df"] > 0))
    alpha = family_alpha / n_tests
    judged = []
    for cell in cells:
        informative = [t for t in cell["tests"] if t["df"] > 0]
        for t in cell["tests"]:
            t["p"] = chi2_sf(t["chi2"], t["df"]) if t["df"] > 0 else 1.0
        rejected = [t for t in informative if t["p"] < alpha]
        n = min((t["n"] for t in cell["tests"]), default=0)
        n_base = min((t["n_baseline"] for t in cell["tests"]), default=0)
        enough = n >= min_n and n_base >= min_n and len(informative) >= MIN_INFORMATIVE
        control = bool(cell.get("control"))
        if control:
            outcome = PASS if rejected else UNDECIDED
        else:
            outcome = FAIL if rejected else PASS if enough else UNDECIDED
        judged.append({**cell, "alpha": alpha, "informative": len(informative), "rejected": len(rejected),
                       "min_p": min((t["p"] for t in informative), default=1.0), "n": n, "n_baseline": n_base,
                       "enough": enough, "outcome": outcome})
    return judged


def judge_sampled(subject: Mapping[str, Any], control: Mapping[str, Any] | None,
                  family_alpha: float = FAMILY_ALPHA, min_n: int = MIN_SAMPLED_N) -> dict[str, Any]:
    """The sampled criterion of one speculative server: its cell against the base and the power control's cell
    (the base at a perturbed temperature against the base, the same ``n``). Pass: the subject not rejected and the
    control rejected; fail: the subject rejected (whatever the control); undecided otherwise."""
    cells = judge_cells([dict(subject, control=False)] + ([dict(control, control=True)] if control else []),
                        family_alpha, min_n)
    subj = cells[0]
    ctrl = cells[1] if control else None
    if subj["outcome"] == FAIL:
        outcome, why = FAIL, (f"{subj['rejected']} of {subj['informative']} tests rejected at alpha "
                              f"{subj['alpha']:.2e} (min p {subj['min_p']:.3g})")
    elif subj["outcome"] == UNDECIDED:
        outcome, why = UNDECIDED, (f"too few samples or informative positions: n {subj['n']}/{subj['n_baseline']} "
                                   f"(at least {min_n} each), {subj['informative']} informative tests (at least "
                                   f"{MIN_INFORMATIVE})")
    elif ctrl is None or ctrl["outcome"] != PASS:
        outcome, why = UNDECIDED, ("the power control (the base at a perturbed temperature) was not rejected at the "
                                   "same n: the test cannot tell a difference of that size"
                                   if ctrl is not None else "no power control was measured")
    else:
        outcome, why = PASS, (f"none of {subj['informative']} tests rejected at alpha {subj['alpha']:.2e} "
                              f"(min p {subj['min_p']:.3g}); the control rejected ({ctrl['rejected']} tests, "
                              f"min p {ctrl['min_p']:.3g})")
    return {"outcome": outcome, "why": why, "subject": subj, "control": ctrl}


# ---------------------------------------------------------------------------------------------------- greedy


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    """The first position where two outputs differ (the shorter length when one is a prefix of the other)."""
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def divergences(outputs: Sequence[Sequence[int] | None], baseline: Sequence[Sequence[int] | None]
                ) -> list[dict[str, Any]]:
    """Every request whose output differs from the base's: ``{"request", "position", "base_token",
    "spec_token"}`` (a missing output on either side is a divergence at position None)."""
    out = []
    for i, (a, b) in enumerate(zip(outputs, baseline, strict=False)):
        if a is not None and b is not None and list(a) == list(b):
            continue
        if a is None or b is None:
            out.append({"request": i, "position": None, "base_token": None, "spec_token": None})
            continue
        k = first_divergence(a, b)
        out.append({"request": i, "position": k, "base_token": b[k] if k < len(b) else None,
                    "spec_token": a[k] if k < len(a) else None})
    return out


def near_tie(top: Mapping[int, float] | None, base_token: int | None, spec_token: int | None
             ) -> tuple[bool, float | None]:
    """Whether a divergence is a near-tie of the base's own distribution at that position (``top``: token ->
    log-probability, its top-k there): both tokens among them, ``|delta| < NEAR_TIE``. (False, None) when it
    cannot be told (not probed, a token outside the top-k: not a near-tie)."""
    if not top or base_token is None or spec_token is None:
        return False, None
    lb, ls = top.get(base_token), top.get(spec_token)
    if lb is None or ls is None:
        return False, None
    delta = abs(lb - ls)
    return delta < NEAR_TIE, delta


def judge_greedy(phases: Sequence[Mapping[str, Any]], probes: Mapping[tuple[str, int], Mapping[int, float]],
                 min_tokens: int = 128) -> dict[str, Any]:
    """Greedy identity of one speculative server: ``phases`` ``[{"name", "outputs", "baseline", "errors"}]``
    (c1, c8, c32 against the base's outputs of the same requests); ``probes[(phase, request)]``: the base's top
    log-probabilities at that request's first divergence."""
    n = same = errors = short = 0
    divs: list[dict[str, Any]] = []
    for ph in phases:
        pairs = list(zip(ph["outputs"], ph["baseline"], strict=False))
        n += len(pairs)
        errors += int(ph.get("errors") or 0)
        short += sum(1 for b in ph["baseline"] if b is not None and len(b) < min_tokens)
        for d in divergences(ph["outputs"], ph["baseline"]):
            tie, delta = near_tie(probes.get((ph["name"], d["request"])), d["base_token"], d["spec_token"])
            divs.append({**d, "phase": ph["name"], "near_tie": tie, "delta_logprob": delta,
                         "probed": (ph["name"], d["request"]) in probes})
        same += len(pairs) - sum(1 for d in divs if d["phase"] == ph["name"])
    not_ties = [d for d in divs if not d["near_tie"]]
    share = same / n if n else 0.0
    if not n:
        outcome, why = UNDECIDED, "no greedy request was compared"
    elif errors:
        outcome, why = FAIL, f"{errors} request(s) answered with an error"
    elif not_ties:
        worst = not_ties[0]
        outcome, why = FAIL, (f"{len(not_ties)} divergence(s) not a near-tie of the base's distribution (first: "
                              f"{worst['phase']} request {worst['request']} position {worst['position']}, "
                              f"delta {worst['delta_logprob']})")
    elif share < GREEDY_SAME_MIN:
        outcome, why = FAIL, f"identical on {share:.2%} of requests (at least {GREEDY_SAME_MIN:.1%})"
    elif short:
        outcome, why = UNDECIDED, f"{short} base output(s) shorter than {min_tokens} tokens"
    else:
        outcome, why = PASS, (f"identical {same}/{n}" + (f", {len(divs)} divergence(s), all near-ties" if divs else
                                                        ", no divergence"))
    return {"outcome": outcome, "why": why, "n": n, "identical": same, "share": round(share, 5),
            "divergences": divs, "not_near_ties": len(not_ties), "errors": errors}


# ---------------------------------------------------------------------------------------------------- refusals


def _refusals_why(served: list[str], unhealthy: list[str], silent: list[str], missing: list[str],
                  served_after: bool) -> str:
    """What went wrong with the refusals, each kind of failure named, in one line (empty when none did): kept
    apart from ``judge_refusals`` so the verdict reads on its own."""
    return "; ".join(part for part in (
        f"served instead of refused: {', '.join(served)}" if served else "",
        f"unhealthy after: {', '.join(unhealthy)}" if unhealthy else "",
        f"no answer: {', '.join(silent)}" if silent else "",
        f"not asked: {', '.join(missing)}" if missing else "",
        "" if served_after else "a plain request failed after the refusals") if part)


def judge_refusals(answers: Sequence[Mapping[str, Any]], served_after: bool) -> dict[str, Any]:
    """``answers``: ``[{"what", "code", "health_after"}]`` for each of ``REFUSALS``; every one must be an error
    (HTTP status >= 400) with the server healthy after it, and the server must serve a plain request after all."""
    served = [a["what"] for a in answers if a.get("code") == 200]
    unhealthy = [a["what"] for a in answers if a.get("health_after") != 200]
    silent = [a["what"] for a in answers if not a.get("code")]
    missing = [w for w, _, _ in REFUSALS if w not in {a["what"] for a in answers}]
    bad = served or unhealthy or silent or missing or not served_after
    why = _refusals_why(served, unhealthy, silent, missing, served_after)
    return {"outcome": FAIL if bad else PASS, "why": why or f"all {len(answers)} refused, still serving",
            "answers": list(answers), "served_after": served_after}


# ---------------------------------------------------------------------------------------------------- worth


def speed(results: Iterable[Mapping[str, Any]], wall_s: float) -> dict[str, Any]:
    """Tokens/s and accept length (tokens per verify round, SGLang's ``spec_verify_ct``) of one phase."""
    rows = list(results)
    tokens = sum(int(r.get("completion_tokens") or 0) for r in rows)
    rounds = sum(int(r.get("spec_verify_ct") or 0) for r in rows)
    return {"tokens": tokens, "wall_s": round(wall_s, 4), "tok_per_s": round(tokens / wall_s, 2) if wall_s > 0
            else None, "accept_len": round(tokens / rounds, 4) if rounds else None, "requests": len(rows)}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def judge_worth(ddtree: Mapping[str, Mapping[str, Any]], dflash: Mapping[str, Mapping[str, Any]],
                base: Mapping[str, Mapping[str, Any]], concurrency_key: str) -> dict[str, Any]:
    """Worth of a DDTREE server: per speed phase (``"c1"``, ``"c<N>"``) its tokens/s and accept length against
    DFLASH's and the base's; ``faster``: tokens/s above DFLASH's at the profile's concurrency (None when either
    was not measured)."""
    rows = {}
    for key, mine in ddtree.items():
        rows[key] = {"tok_per_s": mine.get("tok_per_s"), "accept_len": mine.get("accept_len"),
                     "tok_per_s_vs_dflash": ratio(mine.get("tok_per_s"), dflash.get(key, {}).get("tok_per_s")),
                     "accept_vs_dflash": ratio(mine.get("accept_len"), dflash.get(key, {}).get("accept_len")),
                     "tok_per_s_vs_base": ratio(mine.get("tok_per_s"), base.get(key, {}).get("tok_per_s")),
                     "dflash_tok_per_s": dflash.get(key, {}).get("tok_per_s"),
                     "base_tok_per_s": base.get(key, {}).get("tok_per_s")}
    at = rows.get(concurrency_key, {}).get("tok_per_s_vs_dflash")
    return {"phases": rows, "concurrency": concurrency_key, "vs_dflash_at_concurrency": at,
            "faster": None if at is None else at > 1.0}


# ---------------------------------------------------------------------------------------------------- outcome


def outcome(greedy: Mapping[str, Any], sampled: Mapping[str, Any], refusals: Mapping[str, Any],
            worth: Mapping[str, Any], problems: Sequence[str] = ()) -> dict[str, Any]:
    """One budget's outcome from its criteria: fail when any criterion fails (or the server failed:
    ``problems``), undecided when any is undecided, else pass -- or ``lossless-not-faster`` when DDTREE is not
    faster than DFLASH at the profile's concurrency (undecided when that was not measured)."""
    parts = {"greedy": greedy, "sampled": sampled, "refusals": refusals}
    failed = [f"{k}: {v['why']}" for k, v in parts.items() if v.get("outcome") == FAIL] + list(problems)
    if failed:
        return {"outcome": FAIL, "why": failed}
    open_ = [f"{k}: {v['why']}" for k, v in parts.items() if v.get("outcome") != PASS]
    if worth.get("faster") is None:
        open_.append("worth: tokens/s against DFLASH at the profile's concurrency not measured")
    if open_:
        return {"outcome": UNDECIDED, "why": open_}
    if not worth["faster"]:
        return {"outcome": NOT_FASTER, "why": [
            f"lossless, but {worth['vs_dflash_at_concurrency']:.3f}x DFLASH's tokens/s at {worth['concurrency']}: "
            "DFLASH is the faster choice here"]}
    return {"outcome": PASS, "why": [f"lossless, {worth['vs_dflash_at_concurrency']:.3f}x DFLASH's tokens/s at "
                                     f"{worth['concurrency']}"]}
