"""A site plugin whose one check, ``fleet.verdict``, gives the verdict a test asks for: the fleet tests need a
run that fails, passes, is not judged or hangs on demand, as seen by a real doctor process.

It is installed for real, as Python finds any distribution: a ``.dist-info`` with an ``entry_points.txt`` in the
``k26_doctor.checks`` group, on ``PYTHONPATH`` (no build: nothing to compile). The verdict is read from the file
named by ``K26_FLEET_VERDICT``: ``pass``, ``fail``, ``unjudged``, ``crash`` or ``sleep SECONDS`` (which first
creates that file's name + ``.started``, for a test that interrupts the run while the check runs).
``fleet.verdict`` declares no ``failure=`` (a site plugin's check gets the documented default, "node", and a
warning); ``fleet.config`` declares ``failure="deployment"`` and fails only when the file says ``config-fail``.
"""

from __future__ import annotations

from pathlib import Path

MODULE = '''
import os
import time
from pathlib import Path

from doctor.core.registry import check
from doctor.core.result import Result


@check("fleet.verdict", "The verdict the test asks for", tags=("site",), timeout=120)
def fleet_verdict(ctx):
    """Reads K26_FLEET_VERDICT's file: pass, fail, unjudged, crash or sleep SECONDS."""
    words = Path(os.environ["K26_FLEET_VERDICT"]).read_text().split()
    if words[0] == "fail":
        return Result.failed("the test asks for a failure: " + " ".join(words[1:]))
    if words[0] == "unjudged":
        return Result.not_judged("nothing to compare with (the test says so)")
    if words[0] == "crash":
        raise RuntimeError("the test asks for a crash")
    if words[0] == "sleep":
        Path(os.environ["K26_FLEET_VERDICT"] + ".started").touch()  # the run is in its checks: now interrupt it
        time.sleep(float(words[1]))
    return Result.passed("as the test asks")


@check("fleet.config", "The configuration verdict the test asks for", tags=("site",), failure="deployment")
def fleet_config(ctx):
    """Reads K26_FLEET_VERDICT's file: config-fail fails it (the deployment's configuration), else it passes."""
    words = Path(os.environ["K26_FLEET_VERDICT"]).read_text().split()
    if words[0] == "config-fail":
        return Result.failed("the test asks for a configuration failure: " + " ".join(words[1:]))
    return Result.passed("as the test asks")
'''


def install(root: Path) -> Path:
    """Write the plugin's module and distribution metadata under ``root``; return the directory for PYTHONPATH."""
    site = root / "fleet-plugin"
    dist = site / "k26_fleet_verdict-1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (site / "k26_fleet_verdict.py").write_text(MODULE)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: k26-fleet-verdict\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[k26_doctor.checks]\nfleet = k26_fleet_verdict\n")
    (dist / "top_level.txt").write_text("k26_fleet_verdict\n")
    return site


def verdict_file(root: Path, verdict: str) -> Path:
    path = root / "verdict"
    path.write_text(verdict)
    return path
