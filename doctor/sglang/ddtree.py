"""The DDTree worker gate (sglang.ddtree): the patched SGLang refuses ``--speculative-algorithm DDTREE`` at argument
resolution unless the site opts in with SGLANG_DDTREE_UNVALIDATED_WORKER=1: its tree-verify worker has been
validated on CPU and its kernels on an H200, but never inside a running SGLang server."""

from __future__ import annotations

from typing import Any

from doctor.core.result import Findings, NotJudged, Remediation
from doctor.core.settings import Settings
from doctor.stack.distributions import has_sglang

GATE = "SGLANG_DDTREE_UNVALIDATED_WORKER"


def judge_gate(read_env: Any, read_stack: Any, settings: Settings) -> Findings:
    """``read_env()``: the ``env`` fact (read only when the profile launches DDTREE); ``read_stack()``: the
    ``stack`` fact or None (not recorded), which says whether SGLang is there at all (the wording then names both
    missing parts)."""
    algo = str(settings.get("server.speculative_algorithm", "") or "").upper()
    if algo != "DDTREE":
        raise NotJudged.inapplicable(f"the profile launches {algo or 'no speculative algorithm'}, not DDTREE")
    env = read_env()
    value = (env.get("vars") or {}).get(GATE) if isinstance(env, dict) else None
    out = Findings(variable=GATE, value=value)
    if value == "1":
        return out.warn("sglang.ddtree.opted_in", f"{GATE}=1: SGLang will run the DDTree worker, which has not been "
                        "validated inside a real server",
                        "Compare the first outputs token for token with a non-speculative server (patch set README, "
                        "'Validating on a real host') before serving traffic.")
    env_file = settings.get("server.env_file", "/etc/k26-doctor/sglang-k26.env")
    if has_sglang(read_stack()) is False:  # (not recorded: None, and the gate is judged all the same)
        summary = f"DDTREE needs SGLang with the DDTree patch set (not installed) and {GATE}=1 (not set)"
    else:
        summary = (f"the profile launches DDTREE, but {GATE}=1 is not set: SGLang with the DDTree patch set "
                   "refuses DDTREE without it (its worker is not yet validated on a real host)")
    return out.fail(
        "sglang.ddtree.refused", summary,
        Remediation("Launch the DFlash chain instead (server.speculative_algorithm = \"DFLASH\" in the config), "
                    f"or opt in knowingly with {GATE}=1 in the service's environment file and validate "
                    "as sglang_patches/ddtree-0.5.23/README.md says.",
                    [f"echo '{GATE}=1' | sudo tee -a {env_file}"]))
