"""The tables of the core, row by row: ``Result.of`` (a check's findings -> its status, summary and fix),
``doctor.core.decision.decide`` (a run's results -> status, exit code and the launch gate) and its node view,
``decide_node`` (a run's results -> the node's state and slurm-health's exit). Each row of their docstrings is a
case here, so a change of the table is a change of this file."""

from __future__ import annotations

import pytest

from doctor.core.decision import decide, decide_node
from doctor.core.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from doctor.core.result import Findings, NotJudged, Remediation, Result, Status


def test_a_fail_finding_fails_with_every_fail_message_and_their_fixes_merged() -> None:
    found = (Findings(read=1).info("a.ok", "one thing fine")
             .fail("a.bad", "first", Remediation("do X", ["x"]))
             .warn("a.odd", "odd", Remediation("look", ["look"]))
             .fail("a.worse", "second", Remediation("do X", ["x", "y"])))
    res = Result.of(found)
    assert res.status is Status.FAIL and res.summary == "first; second"
    assert res.remediation == Remediation("do X", ["x", "y"]) and res.details == {"read": 1}
    assert [f.code for f in res.findings] == ["a.ok", "a.bad", "a.odd", "a.worse"]


def test_a_warning_without_a_failure_warns_with_the_info_and_warn_messages() -> None:
    res = Result.of(Findings().info("a.ok", "read 3").warn("a.odd", "one is odd", "check it"))
    assert res.status is Status.WARN and res.summary == "read 3; one is odd"
    assert res.remediation == Remediation("check it")


def test_only_info_passes_without_a_fix() -> None:
    res = Result.of(Findings().info("a.ok", "fine").info("a.also", "also fine"))
    assert res.status is Status.PASS and res.summary == "fine; also fine" and res.remediation is None


def test_folded_findings_are_one_line_and_each_keeps_its_code() -> None:
    """Many problems said once (the first, and how many more) with the fold's one fix; every code stays for the
    fixers (``Findings.fold``)."""
    found = (Findings().fail("a.config", "layers differ", Remediation("own fix")).fail("a.tp", "TP 3 does not divide")
             .fail("a.code", "code missing").fold("config.json: ", Remediation("fetch it", ["get"])))
    res = Result.of(found)
    assert res.status is Status.FAIL and res.summary == "config.json: layers differ (+2 more)"
    assert res.remediation == Remediation("fetch it", ["get"]) and res.has("a.tp") and res.has("a.code")
    one = Result.of(Findings().warn("a.odd", "odd", Remediation("look")).fold("drafter: "))
    assert one.status is Status.WARN and one.summary == "drafter: odd" and one.remediation == Remediation("look")


def test_no_finding_is_an_error_never_a_pass() -> None:
    res = Result.of(Findings(read=1))
    assert res.status is Status.ERROR and "judged nothing" in res.summary


def test_cause_and_exhibit_travel_with_the_findings() -> None:
    found = Findings().fail("a.bad", "broken")
    found.cause, found.exhibit = "gpu.driver", "a matrix"
    res = Result.of(found)
    assert (res.cause, res.exhibit) == ("gpu.driver", "a matrix")


@pytest.mark.parametrize(("raised", "status", "unjudged", "cause"), [
    (NotJudged.missing("no reading"), Status.SKIP, True, None),
    (NotJudged.blocked("NVML is down", "gpu.driver"), Status.SKIP, False, "gpu.driver"),
    (NotJudged.inapplicable("nothing to pair"), Status.SKIP, False, None),
    (NotJudged.failing("the probe failed"), Status.ERROR, False, None),
])
def test_what_cannot_be_judged_is_never_a_pass(raised: NotJudged, status: Status, unjudged: bool,
                                                cause: str | None) -> None:
    def judge() -> Findings:
        raise raised

    res = Result.judging(judge)
    assert (res.status, res.unjudged, res.cause) == (status, unjudged, cause)


def test_codes_match_exactly_or_by_prefix() -> None:
    res = Result.of(Findings().fail("sglang.patches.drifted", "drifted"))
    assert res.has("sglang.patches.drifted") and res.has("sglang.patches.")
    assert not res.has("sglang.patches") and not res.has("sglang.patches.missing")


def result(cid: str, status: Status, unjudged: bool = False) -> Result:
    res = Result(status, "s", id=cid)
    res.unjudged = unjudged
    return res


PASS, WARN, FAIL, ERROR = (result("p", Status.PASS), result("w", Status.WARN), result("f", Status.FAIL),
                           result("e", Status.ERROR))
UNJUDGED, APART = result("u", Status.SKIP, unjudged=True), result("n", Status.SKIP)
STOPPED = Result.errored("interrupted (Ctrl-C) before it finished", interrupted=True)  # not a failure of its own


@pytest.mark.parametrize(("results", "kw", "status", "code", "refusal"), [
    ([PASS, WARN, FAIL, UNJUDGED], {}, Status.FAIL, EXIT_FAILED, "1 check(s) failed: f"),
    ([PASS, ERROR], {"interrupted": True}, Status.FAIL, EXIT_INTERRUPTED, "the run was interrupted"),
    ([PASS, STOPPED], {"interrupted": True}, Status.PASS, EXIT_INTERRUPTED, "the run was interrupted"),
    ([PASS, WARN], {"interrupted": True}, Status.WARN, EXIT_INTERRUPTED, "the run was interrupted"),
    ([PASS, UNJUDGED], {"strict": True}, Status.FAIL, EXIT_FAILED, "1 check(s) could not be judged"),
    ([PASS, UNJUDGED], {}, Status.PASS, EXIT_OK, "1 check(s) could not be judged"),
    ([WARN, UNJUDGED], {}, Status.WARN, EXIT_OK, "1 check(s) could not be judged"),
    ([PASS, WARN], {"strict": True}, Status.FAIL, EXIT_FAILED, "warnings under --strict"),
    ([PASS, WARN, APART], {}, Status.WARN, EXIT_OK, None),
    ([PASS, APART], {}, Status.PASS, EXIT_OK, None),
    ([PASS, APART], {"strict": True}, Status.PASS, EXIT_OK, None),
])
def test_the_run_is_decided_by_the_first_row_that_holds(results: list[Result], kw: dict, status: Status, code: int,
                                                        refusal: str | None) -> None:
    got = decide(results, **kw)
    assert (got.status, got.exit_code) == (status, code)
    assert got.refusal == refusal if refusal is None else got.refusal.startswith(refusal)


def by_id_prefix(failed: list[Result]) -> tuple[list[Result], list[Result]]:
    """A split as ``fleet.split_by_failure`` makes it: here the results whose id starts with "cfg" are the
    deployment's configuration's."""
    return [r for r in failed if not r.id.startswith("cfg")], [r for r in failed if r.id.startswith("cfg")]


CONFIG = result("cfg", Status.FAIL)
CONFIG_UNJUDGED = result("cfg-u", Status.SKIP, unjudged=True)
CONFIG_UNJUDGED.failure = "deployment"
STOPPED_HERE = result("s", Status.ERROR)  # a check Ctrl-C stopped, as the runner records it
STOPPED_HERE.details["interrupted"] = True


@pytest.mark.parametrize(("results", "kw", "state", "code", "node", "configuration", "unjudged"), [
    # interrupted: no verdict on the node whatever finished (the checks it stopped are in no list)
    ([PASS, FAIL, ERROR, STOPPED_HERE, UNJUDGED, CONFIG], {"interrupted": True, "drain_unjudged": True},
     "interrupted", EXIT_INTERRUPTED, ["f", "e"], ["cfg"], ["u"]),
    ([PASS, STOPPED_HERE], {"interrupted": True, "strict": True}, "interrupted", EXIT_INTERRUPTED, [], [], []),
    ([PASS, UNJUDGED], {"strict": True, "interrupted": True}, "interrupted", EXIT_INTERRUPTED, [], [], ["u"]),
    ([PASS, UNJUDGED, CONFIG], {"interrupted": True}, "interrupted", EXIT_INTERRUPTED, [], ["cfg"], ["u"]),
    ([PASS, FAIL, ERROR, UNJUDGED, CONFIG], {"drain_unjudged": True}, "failed", EXIT_FAILED, ["f", "e"], ["cfg"],
     ["u"]),
    ([PASS, WARN], {"strict": True}, "failed", EXIT_FAILED, ["w"], [], []),
    ([PASS, UNJUDGED], {"drain_unjudged": True}, "not_judged", EXIT_FAILED, [], [], ["u"]),
    ([PASS, UNJUDGED], {"strict": True}, "not_judged", EXIT_FAILED, [], [], ["u"]),
    ([PASS, UNJUDGED, WARN, CONFIG], {}, "healthy", EXIT_OK, [], ["cfg"], ["u"]),
    ([PASS, CONFIG_UNJUDGED], {"drain_unjudged": True}, "healthy", EXIT_OK, [], [], []),
])
def test_the_node_is_decided_by_the_first_row_that_holds(results: list[Result], kw: dict, state: str, code: int,
                                                         node: list[str], configuration: list[str],
                                                         unjudged: list[str]) -> None:
    got = decide_node(results, by_id_prefix, **kw)
    assert (got.state, got.exit_code) == (state, code)
    assert [[r.id for r in part] for part in (got.node, got.configuration, got.unjudged)] == [node, configuration,
                                                                                              unjudged]
