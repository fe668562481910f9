"""The report as OpenMetrics text, for Prometheus: node_exporter's textfile collector serves the file
(``check --format openmetrics --output /var/lib/prometheus/node-exporter/k26-doctor.prom``).

Series, every one labelled with the profile (node_exporter adds ``instance``); the doctor's version is on one
series only, ``k26_doctor_build_info{version}``, so that an upgrade changes no other series' identity:

* ``k26_doctor_check_status{check, affects, status}``: one series per check and status (pass, warn, fail, skip,
  error), 1 for the check's status and 0 for the others, so an alert reads ``{status=~"fail|error"} == 1`` and a
  check that recovers ends its alert instead of vanishing; ``affects`` is what the check declares its failure
  means (``@check(failure=...)``; CONTRACT.md names the label): ``node``, the node's hardware or host (pages),
  ``deployment``, the configuration (warns);
* ``k26_doctor_check_reason_info{check, code, affects}``: 1 for each finding code that made a check fail or
  warn (``gpu.nvlink.link_down``), a bounded label (codes are a fixed set, the messages stay out), so an alert
  says why; a result with no finding (an error, a crash) has ``code="<check>.<status>"``;
* ``k26_doctor_check_unjudged{check}``: 1 when a skip was for want of facts (never a pass for ``launch``);
* ``k26_doctor_check_duration_seconds{check}``;
* ``k26_doctor_gpu_info{gpu, UUID, device, pci_bus_id}``: 1 per GPU the run read (NVML), labelled as NVIDIA's
  DCGM exporter labels its series (its ``modelName`` is left out: camelCase, which ``promtool check metrics``
  refuses), to join the node's verdict with DCGM's per-GPU series;
* ``k26_doctor_verdict{status}``: the run's verdict (pass, warn, fail; ``--strict`` applied), one-hot;
* ``k26_doctor_run_duration_seconds``, ``k26_doctor_run_interrupted``;
* ``k26_doctor_run_started_timestamp_seconds`` and ``k26_doctor_last_run_timestamp_seconds`` (wall clock when the
  run began and finished): a verdict whose timestamp stops advancing is stale; a start later than the last finish
  that stays so is a run that never finished (``started_marker`` writes the start before the checks run).

Only gauges, and no sample timestamps: the textfile collector refuses those, and the output is read by both
the Prometheus text parser (``promtool check metrics``) and OpenMetrics parsers; it ends with ``# EOF``.
Free-text comments are not OpenMetrics, so there are none; summaries stay out (unbounded label values).
A renderer: it only renders (the file is written by ``doctor.service.textfile`` through the atomic writer).
"""

from __future__ import annotations

from typing import Any

from doctor import __version__
from doctor.core.result import Status

PREFIX = "k26_doctor_"
STATUSES = (Status.PASS, Status.WARN, Status.FAIL, Status.SKIP, Status.ERROR)
VERDICTS = (Status.PASS, Status.WARN, Status.FAIL)
EOF = "# EOF\n"

CHECK_STATUS = PREFIX + "check_status"
CHECK_REASON = PREFIX + "check_reason_info"
GPU_INFO = PREFIX + "gpu_info"
BUILD_INFO = PREFIX + "build_info"
CHECK_UNJUDGED = PREFIX + "check_unjudged"
CHECK_DURATION = PREFIX + "check_duration_seconds"
VERDICT = PREFIX + "verdict"
RUN_DURATION = PREFIX + "run_duration_seconds"
RUN_INTERRUPTED = PREFIX + "run_interrupted"
RUN_STARTED = PREFIX + "run_started_timestamp_seconds"
LAST_RUN = PREFIX + "last_run_timestamp_seconds"

HELP = {
    CHECK_STATUS: "1 for the status the check had in the last run, 0 for the other statuses.",
    CHECK_REASON: "1 for each finding code that made the check fail or warn in the last run.",
    GPU_INFO: "1 per GPU the last run read, labelled as DCGM's exporter labels it (gpu, UUID).",
    BUILD_INFO: "1, labelled with the version of k26-doctor that wrote this file.",
    CHECK_UNJUDGED: "1 when the check could not be judged for want of facts (never a pass for launch).",
    CHECK_DURATION: "How long the check took in the last run.",
    VERDICT: "1 for the last run's verdict (--strict applied), 0 for the others.",
    RUN_DURATION: "How long the last run took.",
    RUN_INTERRUPTED: "1 when the last run was interrupted before every check finished.",
    RUN_STARTED: "When the latest run started (Unix time); later than the last finish while a run is under way.",
    LAST_RUN: "When the last run finished (Unix time).",
}


def escape_label(value: str) -> str:
    """A label value as the exposition formats quote it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15):
        return str(int(value))
    return repr(float(value))


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    inner = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {_number(value)}\n"


def family(name: str, samples: list[str]) -> str:
    """The metadata lines of one gauge family followed by its samples (OpenMetrics wants them together)."""
    head = f"# HELP {name} {_escape_help(HELP[name])}\n# TYPE {name} gauge\n"
    if name.endswith("_seconds"):
        head += f"# UNIT {name} seconds\n"
    return head + "".join(samples)


def run_labels(settings: Any) -> dict[str, str]:
    """The labels of every series: the profile (the version is ``k26_doctor_build_info``'s alone)."""
    return {"profile": str(settings.profile_name)}


def reason_codes(res: Any) -> list[str]:
    """The codes that say why ``res`` failed or warned: its fail (else warn) findings' codes, each once; a result
    without such a finding (an error, a crash, a plugin's one-step result) is ``<check>.<status>``."""
    if res.status not in (Status.FAIL, Status.WARN, Status.ERROR):
        return []
    for severity in ("fail", "warn"):
        codes = [f.code for f in res.findings if getattr(f.severity, "value", f.severity) == severity]
        if codes:
            return list(dict.fromkeys(codes))
    return [f"{res.id}.{res.status.value}"]


def gpus(report: Any) -> list[dict[str, str]]:
    """The GPUs the run read (the ``nvml`` fact, when the run had it), as DCGM's exporter labels them."""
    ctx = getattr(report, "context", None)
    facts = getattr(ctx, "facts", None)
    if facts is None or "nvml" not in facts.collected():
        return []
    try:
        nvml = facts.get("nvml")
    except Exception:  # a malformed or failed reading: the checks said so; no GPU series
        return []
    out = []
    for dev in (nvml or {}).get("devices") or []:
        if not isinstance(dev, dict) or not isinstance(dev.get("index"), int):
            continue
        out.append({"gpu": str(dev["index"]), "UUID": str(dev.get("uuid") or ""), "device": f"nvidia{dev['index']}",
                    "pci_bus_id": str(dev.get("pci_bus_id") or "")})
    return out


def to_openmetrics(report: Any) -> str:
    """The whole report: the families above, ``# EOF`` last."""
    base = run_labels(report.settings)
    status_rows, reason_rows, unjudged_rows, duration_rows = [], [], [], []
    for res in report.results:
        check = {"check": res.id}
        failure = {"affects": str(getattr(res, "failure", "node"))}
        for status in STATUSES:
            status_rows.append(_sample(CHECK_STATUS, {**check, **failure, "status": status.value, **base},
                                       int(res.status is status)))
        reason_rows += [_sample(CHECK_REASON, {**check, "code": code, **failure, **base}, 1)
                        for code in reason_codes(res)]
        unjudged_rows.append(_sample(CHECK_UNJUDGED, {**check, **base}, int(bool(res.unjudged))))
        duration_rows.append(_sample(CHECK_DURATION, {**check, **base}, round(float(res.duration_s), 6)))
    verdict = report.decision().status
    parts = [
        family(BUILD_INFO, [_sample(BUILD_INFO, {"version": __version__, **base}, 1)]),
        family(CHECK_STATUS, status_rows),
        family(CHECK_REASON, reason_rows) if reason_rows else "",
        family(CHECK_UNJUDGED, unjudged_rows),
        family(CHECK_DURATION, duration_rows),
        family(VERDICT, [_sample(VERDICT, {"status": s.value, **base}, int(verdict is s)) for s in VERDICTS]),
        family(RUN_DURATION, [_sample(RUN_DURATION, base, round(float(report.outcome.duration_s), 6))]),
        family(RUN_INTERRUPTED, [_sample(RUN_INTERRUPTED, base, int(bool(report.outcome.interrupted)))]),
    ]
    gpu_rows = [_sample(GPU_INFO, {**gpu, **base}, 1) for gpu in gpus(report)]
    if gpu_rows:
        parts.append(family(GPU_INFO, gpu_rows))
    if report.started_at is not None:
        parts.append(family(RUN_STARTED, [_sample(RUN_STARTED, base, round(report.started_at, 3))]))
    if report.finished_at is not None:
        parts.append(family(LAST_RUN, [_sample(LAST_RUN, base, round(report.finished_at, 3))]))
    return "".join(parts) + EOF


def _family_of(line: str) -> str | None:
    """The metric family a line of our own output belongs to (None for ``# EOF`` and blank lines)."""
    if line.startswith("# "):
        words = line.split(" ", 3)
        return words[2] if len(words) >= 3 and words[1] in ("HELP", "TYPE", "UNIT") else None
    name = line.split("{", 1)[0].split(" ", 1)[0]
    return name or None


def ours(text: str) -> bool:
    """Whether ``text`` is a file this renderer wrote: only ``k26_doctor_`` families and ``# EOF``."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or lines[-1] != EOF.strip():
        return False
    for ln in lines[:-1]:
        fam = _family_of(ln)
        if fam is None or not fam.startswith(PREFIX) or (ln.startswith("#") and fam not in HELP):
            return False
    return True


def started_marker(previous: str | None, started_at: float, labels: dict[str, str]) -> str:
    """The file to expose while a run is under way: the last run's series as they were (``previous``, when it is
    a file of ours) with ``k26_doctor_run_started_timestamp_seconds`` set to ``started_at``."""
    kept = []
    if previous and ours(previous):
        kept = [ln + "\n" for ln in previous.splitlines() if ln.strip() and ln != EOF.strip()
                and _family_of(ln) != RUN_STARTED]
    return "".join(kept) + family(RUN_STARTED, [_sample(RUN_STARTED, labels, round(started_at, 3))]) + EOF
