"""NVSwitch fabric readiness: the state of every GPU of the TP group, and waiting for it.

On an HGX host every GPU must register with the NVLink fabric before CUDA can use it; the fabric
manager does that after boot, and it takes minutes (on NVLink 5 systems NVLSM must first bring up
the switches). A GPU says ``not_started`` (fabric manager not running), ``in_progress``, then
``completed`` with a status (``Success``, or the error that stopped it). A GPU without a fabric
says ``not_supported``.

``readiness(nvml, size)`` judges one reading of the ``nvml`` fact; ``wait_for_fabric(source, ...)``
polls a fact source until every GPU of the TP group is completed with success or the time runs
out. The source is any callable returning an ``nvml`` fact: the real one collects it again in an
isolated child process with a deadline (``nvml_source``), a test feeds recorded facts. The wait
prints progress and ends with a verdict that names the state and the fix; ``launch`` and the
unit's ``ExecStartPre`` wait (``[gpu] fabric_wait_s``), ``check`` only with ``--wait-fabric SECONDS``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.gpu import links
from doctor.gpu.group import label, tp_group
from doctor.gpu.nvml_fact import NvmlFact

PENDING = ("not_started", "in_progress")
POLL_INTERVAL_S = 5.0  # at most; a short wait (--wait-fabric 20) polls every tenth of it, at least every 0.5 s
REPORT_EVERY_S = 30.0


@dataclass
class Readiness:
    """One reading of the fabric state of the TP group."""

    outcome: str  # ready | pending | failed | no_fabric | mixed | unreadable | unavailable | no_gpu | no_answer
    states: dict[str, str] = field(default_factory=dict)  # "GPU0" -> "in_progress" / "completed" / "completed:..."
    pending: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # "GPU3: NotSupported" (completed with an error)
    unread: list[str] = field(default_factory=list)
    fabric_manager: str | None = None  # systemctl is-active of nvidia-fabricmanager, when read
    error: str | None = None

    def describe(self) -> str:
        """``in progress on GPU0-GPU7`` style, for progress lines and verdicts."""
        if self.outcome == "unavailable":
            return f"NVML is not available ({self.error})"
        groups: dict[str, list[str]] = {}
        for gpu, state in self.states.items():
            groups.setdefault(state, []).append(gpu)
        parts = [f"{state.replace('_', ' ')} on {span(gpus)}" for state, gpus in groups.items()]
        if self.unread:
            parts.append("not read on " + ", ".join(self.unread))
        text = "; ".join(parts) or "no GPU"
        if self.fabric_manager:
            text += f" (nvidia-fabricmanager is {self.fabric_manager})"
        return text


def span(gpus: list[str]) -> str:
    """``GPU0-GPU7`` for a contiguous run, else a list."""
    nums = []
    for g in gpus:
        tail = g[3:] if g.startswith("GPU") else ""
        if not tail.isdigit():
            return ", ".join(gpus)
        nums.append(int(tail))
    if len(nums) > 2 and nums == list(range(nums[0], nums[0] + len(nums))):
        return f"GPU{nums[0]}-GPU{nums[-1]}"
    return ", ".join(gpus)


def _read_gpu(out: Readiness, d: dict[str, Any]) -> bool:
    """Record one GPU's fabric state in ``out``; True when that GPU has no fabric (NotSupported), which only
    counts: a host whose GPUs all lack one has no fabric, some lacking it is a mixed host."""
    g = label(d)
    f = d.get("fabric")
    state = f.get("state_name") if isinstance(f, dict) else None
    if state is None:
        err = f.get("error") if isinstance(f, dict) else None
        if err and str(err).startswith("NotSupported"):
            out.states[g] = "not_supported"
            return True
        out.unread.append(f"{g} ({err or 'not read'})")
        return False
    status = f.get("status")
    if state == "completed" and status not in (0, None):
        out.states[g] = "completed with an error"
        out.failed.append(f"{g}: {f.get('status_name') or status}")
        return False
    out.states[g] = str(state)
    if state in PENDING:
        out.pending.append(g)
    return state == "not_supported"


def _outcome(out: Readiness, unsupported: int, gpus: int) -> str:
    """The group's outcome from its GPUs' states, the worst first: an error, a wait, an unread GPU, no fabric."""
    if out.failed:
        return "failed"
    if out.pending:
        return "pending"
    if out.unread:
        return "unreadable"
    if unsupported == gpus:
        return "no_fabric"
    return "mixed" if unsupported else out.outcome


def readiness(nvml: Any, size: int) -> Readiness:
    """Judge one ``nvml`` fact: is every GPU of the first ``size`` registered with the fabric?"""
    if not isinstance(nvml, dict):
        return Readiness("unreadable", error=f"the nvml fact is {type(nvml).__name__}, not an object")
    if not nvml.get("available"):
        return Readiness("unavailable", error=str(nvml.get("error") or "unknown reason"))
    grp = links.group(nvml, size)
    fm = nvml.get("fabric_manager") if isinstance(nvml.get("fabric_manager"), dict) else {}
    out = Readiness("ready", fabric_manager=fm.get("systemctl_is_active"))
    if not grp:
        out.outcome = "no_gpu"
        return out
    unsupported = sum(_read_gpu(out, d) for d in grp)
    out.outcome = _outcome(out, unsupported, len(grp))
    return out


# What ends a wait: these do not change by waiting longer. A poll that got no answer at all (the collector
# hung or failed: ``no_answer``) is tried again.
FINAL = ("ready", "failed", "no_fabric", "mixed", "unavailable", "no_gpu", "unreadable")


@dataclass
class FabricWait:
    """How a wait for the fabric ended (``to_fact()`` is the ``fabric_wait`` fact)."""

    outcome: str  # ready | timeout | failed | no_fabric | mixed | unavailable | no_gpu | unreadable | no_answer
    timeout_s: float
    waited_s: float
    polls: int
    last: Readiness
    last_fact: Any = None
    history: list[dict[str, Any]] = field(default_factory=list)  # each change of state: {"t": s, "state": text}
    poll_errors: list[str] = field(default_factory=list)

    def verdict(self) -> str:
        """One line: the state reached and, when it is not ready, the fix."""
        took = f"{self.waited_s:.0f} s"
        if self.outcome == "ready":
            return f"NVSwitch fabric completed on {len(self.last.states)} GPU(s) after {took}"
        if self.outcome == "timeout":
            return (f"NVSwitch fabric not ready after {took} (limit {self.timeout_s:g} s): {self.last.describe()}. "
                    + FIX_PENDING)
        if self.outcome == "failed":
            return (f"NVSwitch fabric registration failed: {', '.join(self.last.failed)}. Read "
                    f"`journalctl -u nvidia-fabricmanager -n 100`, then `sudo systemctl restart nvidia-fabricmanager`")
        if self.outcome == "no_fabric":
            return "no NVSwitch fabric on these GPUs (NotSupported): nothing to wait for"
        if self.outcome == "no_answer":
            last = self.poll_errors[-1] if self.poll_errors else "no answer"
            return f"the fabric state could not be read within {took} ({self.polls} tries): {last}"
        return f"fabric wait ended ({self.outcome}): {self.last.describe()}"

    def to_fact(self) -> dict[str, Any]:
        return {"asked": True, "outcome": self.outcome, "timeout_s": self.timeout_s,
                "waited_s": round(self.waited_s, 3), "polls": self.polls, "state": self.last.describe(),
                "history": self.history, "poll_errors": self.poll_errors[-5:], "verdict": self.verdict()}


FIX_PENDING = ("Fix: start the fabric manager at the driver's version and let it finish "
               "(`sudo systemctl enable --now nvidia-fabricmanager`, `journalctl -u nvidia-fabricmanager`); "
               "on NVLink 5 (B200/B300) NVLSM must run too (see gpu.fabric.nvlsm); "
               "`nvidia-smi -q | grep -A3 -i fabric` shows the state")


def wait_for_fabric(source: Callable[[], Any], size: int, timeout_s: float, *,
                    interval_s: float = POLL_INTERVAL_S, report_every_s: float = REPORT_EVERY_S,
                    progress: Callable[[str], None] | None = None,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> FabricWait:
    """Poll ``source()`` (an ``nvml`` fact each call; it may raise) until the TP group's fabric is ready, a
    state that waiting cannot change is reached, or ``timeout_s`` has passed. Never raises for what the
    source returns or raises; a poll that fails is recorded and the next one tried."""
    say = progress or (lambda _msg: None)
    start = clock()
    deadline = start + max(0.0, float(timeout_s))
    polls = 0
    history: list[dict[str, Any]] = []
    errors: list[str] = []
    last = Readiness("no_answer", error="not read yet")
    last_fact: Any = None
    last_text, last_report = None, start
    while True:
        polls += 1
        try:
            fact = source()
            last_fact = fact
            last = readiness(fact, size)
        except Exception as exc:  # FactUnavailable (a hung or failed collector), anything else alike
            errors.append(f"{type(exc).__name__}: {exc}")
            last = Readiness("no_answer", error=errors[-1])
        now = clock()
        text = last.describe() if last.states or last.outcome == "unavailable" else f"not read ({last.error})"
        if text != last_text:
            history.append({"t": round(now - start, 3), "state": text})
        if last.outcome in FINAL:
            outcome = last.outcome
            break
        if now >= deadline:
            outcome = "timeout" if last.outcome == "pending" else last.outcome
            break
        if text != last_text or now - last_report >= report_every_s:
            say(f"waiting for the NVSwitch fabric ({now - start:.0f} s of {timeout_s:g} s): {text}")
            last_report = now
        last_text = text
        sleep(max(0.0, min(interval_s, deadline - now)))
    result = FabricWait(outcome, float(timeout_s), clock() - start, polls, last, last_fact, history, errors)
    if polls > 1 or outcome != "no_fabric":
        say(result.verdict())
    return result


def nvml_source(collector: Any, options: Any) -> Callable[[], Any]:
    """The real source: the ``nvml`` collector run again in its isolated child process, under its deadline."""
    from doctor.facts.isolation import collect_isolated

    def read() -> Any:
        return collect_isolated(collector, options)

    return read


def wait_before_checks(ctx: Any, collectors: dict[str, Any], progress: Callable[[str], None] | None = None
                       ) -> FabricWait | None:
    """Wait for the fabric as ``ctx.settings.wait_fabric`` asks, before the checks run; the last reading becomes
    the run's ``nvml`` fact and the outcome its ``fabric_wait`` fact, so ``gpu.fabric`` judges what the wait saw."""
    coll = collectors.get("nvml")
    seconds = getattr(ctx.settings, "wait_fabric", None)
    if coll is None or not seconds or ctx.facts.replaying:
        return None
    seconds = float(seconds)
    result = wait_for_fabric(nvml_source(coll, ctx.facts.options), ctx.settings.world_size, seconds,
                             interval_s=min(POLL_INTERVAL_S, max(0.5, seconds / 10)), progress=progress)
    if result.last_fact is not None and result.outcome != "no_answer":
        ctx.facts.seed("nvml", result.last_fact)
    ctx.facts.seed("fabric_wait", result.to_fact())
    return result


# -- gpu.fabric: one reading judged ----------------------------------------------------------------------

FABRIC_DOWN = "gpu.fabric.not_ready"  # the finding the gpu.fabric fixer acts on (start the fabric manager)


def waited(fact: Any) -> dict[str, Any] | None:
    """The wait's record when this run waited for the fabric (``--wait-fabric``, ``launch``), else None. Old
    snapshots have no such fact: that is "no wait", never a different verdict."""
    if not isinstance(fact, dict) or not fact.get("asked"):
        return None
    num = (int, float)
    return {**fact, "waited_s": fact["waited_s"] if isinstance(fact.get("waited_s"), num) else 0.0,
            "timeout_s": fact["timeout_s"] if isinstance(fact.get("timeout_s"), num) else 0.0,
            "polls": fact["polls"] if isinstance(fact.get("polls"), int) else 1}


def fabric_states(grp: list[Any]) -> tuple[dict[str, list[str]], list[str]]:
    """GPUs by fabric state (``not_supported`` for a GPU without a fabric), and those whose state was not read."""
    states: dict[str, list[str]] = {}
    unread: list[str] = []
    for d in grp:
        f = d.get("fabric")
        if not isinstance(f, dict) or f.get("state") is None:
            err = (f or {}).get("error") if isinstance(f, dict) else None
            if err and str(err).startswith("NotSupported"):
                states.setdefault("not_supported", []).append(label(d))
            else:
                unread.append(f"{label(d)} ({err or 'not read'})")
            continue
        states.setdefault(str(f.get("state_name")), []).append(label(d))
    return states, unread


def _fabric_of(d: dict[str, Any]) -> dict[str, Any]:
    """One GPU's fabric record (empty when it has none)."""
    return d.get("fabric") or {}


def _failed_registrations(grp: list[dict[str, Any]]) -> list[str]:
    """``GPU3: <status>`` for every GPU whose registration completed with an error."""
    return [f"{label(d)}: {_fabric_of(d).get('status_name')}" for d in grp
            if _fabric_of(d).get("state_name") == "completed" and _fabric_of(d).get("status")]


def _unjudged_fabric(unread: list[str], states: dict[str, list[str]], nvswitch: bool, details: dict[str, Any]) -> None:
    """Raise ``NotJudged`` when the fabric cannot be judged: a state not read (failing where the profile expects
    an NVSwitch, inapplicable where it does not), or no GPU with a fabric at all."""
    if unread:
        if nvswitch:
            raise NotJudged.failing("could not read the fabric state of " + ", ".join(unread), **details)
        raise NotJudged.inapplicable("fabric state not read (" + ", ".join(unread) + "); the profile expects no "
                                     "NVSwitch", **details)
    if "completed" not in states:
        raise NotJudged.inapplicable("the GPUs report no NVSwitch fabric (NotSupported)"
                                     + ("; the profile expects one: see gpu.nvlink" if nvswitch else ""), **details)


def _after_wait(wait_record: dict[str, Any] | None) -> str:
    """`` (after waiting N s)`` when the fabric became ready only after more than one poll."""
    if wait_record and wait_record.get("polls", 1) > 1:
        return f" (after waiting {wait_record.get('waited_s', 0):.0f} s)"
    return ""


def judge_fabric(nvml: NvmlFact, wait: Any, settings: Settings) -> Findings:
    """Every GPU of the TP group registered with the NVSwitch fabric, completed with success."""
    grp = tp_group(nvml, settings.world_size)
    fm = nvml.get("fabric_manager") or {}
    driver = nvml.get("driver_version")
    out = Findings(per_gpu={label(d): d.get("fabric") for d in grp}, fabric_manager=fm or None,
                   driver_version=driver)
    wait_record = waited(wait)
    if wait_record:
        out.details["fabric_wait"] = wait_record
    states, unread = fabric_states(grp)
    bad = {s: g for s, g in states.items() if s in PENDING}
    if bad:
        return not_ready(bad, fm, driver, wait_record, out)
    failed = _failed_registrations(grp)
    if failed:
        return out.fail("gpu.fabric.failed", "fabric registration completed with an error: " + ", ".join(failed),
                        Remediation("Read the fabric manager log; restart it (same version as the driver).",
                                    ["journalctl -u nvidia-fabricmanager -n 100",
                                     "sudo systemctl restart nvidia-fabricmanager"]))
    _unjudged_fabric(unread, states, bool(settings.gpu.nvswitch), out.details)
    if states.get("not_supported"):
        return out.fail("gpu.fabric.partial", f"fabric completed on {len(states['completed'])} GPU(s) but not "
                        "supported on " + ", ".join(states["not_supported"]))
    unhealthy = [f"{label(d)}: {_fabric_of(d).get('health_summary')}" for d in grp
                 if _fabric_of(d).get("health_summary") in ("unhealthy", "limited_capacity")]
    if unhealthy:
        return out.warn("gpu.fabric.unhealthy", "fabric completed but health says " + ", ".join(unhealthy),
                        Remediation("Check the fabric manager log and the NVLink error counters.",
                                    ["journalctl -u nvidia-fabricmanager -n 100", "nvidia-smi nvlink -e"]))
    return out.info("gpu.fabric.ready", f"NVSwitch fabric completed on all {len(grp)} GPU(s){_after_wait(wait_record)}")


def not_ready(bad: dict[str, list[str]], fm: Any, driver: str | None, wait_record: dict[str, Any] | None,
              out: Findings) -> Findings:
    """GPUs not started or in progress: the fabric manager is not running (or not at the driver's version)."""
    fix_text = ("Start the NVIDIA fabric manager, the same version as the driver"
                + (f" ({driver})" if driver else "") + ", and wait until every GPU says completed.")
    fm_ver = fm.get("version")
    if fm_ver and driver and fm_ver != driver:
        fix_text += f" Installed fabric manager is {fm_ver}, the driver {driver}: install the matching version."
    parts = [f"{s.replace('_', ' ')} on {', '.join(g)}" for s, g in bad.items()]
    after = (f" after waiting {wait_record.get('waited_s', 0):.0f} s (limit {wait_record.get('timeout_s', 0):g} s)"
             if wait_record else "")
    return out.fail(FABRIC_DOWN, f"NVSwitch fabric not ready{after}: " + "; ".join(parts)
                    + (f" (nvidia-fabricmanager is {fm.get('systemctl_is_active')})"
                       if fm.get("systemctl_is_active") else ""),
                    Remediation(fix_text, ["sudo systemctl start nvidia-fabricmanager",
                                           "systemctl status nvidia-fabricmanager",
                                           "nvidia-smi -q | grep -i -A3 fabric"]))
