"""The DDTree worker gate: a profile that launches DDTREE must know whether SGLang will accept it.

The shipped patch set (sglang_patches/ddtree-0.5.23) stops ``--speculative-algorithm DDTREE`` at
argument resolution unless ``SGLANG_DDTREE_UNVALIDATED_WORKER=1`` is set, because its SGLang worker
glue has not yet run on a real host (its README, "Validating on a real host"). Without this check the
server would refuse after its slow imports; with it, ``check`` says so in seconds.
"""

from __future__ import annotations

from doctor.context import Context
from doctor.registry import check
from doctor.result import Remediation, Result

GATE = "SGLANG_DDTREE_UNVALIDATED_WORKER"


@check("sglang.ddtree", "DDTREE will be accepted by the patched SGLang (worker gate)", needs=("env",))
def ddtree_gate(ctx: Context) -> Result:
    """When the profile launches `--speculative-algorithm DDTREE`, reads the service's environment
    (process, profile [server.env], EnvironmentFile) for SGLANG_DDTREE_UNVALIDATED_WORKER.

    Why: the DDTree patch set's tree-verify worker has been validated on CPU (torch, Triton's
    interpreter) and its kernels on an H200, but never inside a running SGLang server; the patched
    SGLang refuses DDTREE at argument resolution unless the site opts in with that variable. A start
    without it fails after minutes of imports.
    Fix by hand: set server.speculative_algorithm = "DFLASH" in the config (chain verification,
    validated upstream), or opt in knowingly (`SGLANG_DDTREE_UNVALIDATED_WORKER=1` in the env file)
    and validate as the patch set's README says.
    """
    algo = str(ctx.expect("server.speculative_algorithm", "") or "").upper()
    if algo != "DDTREE":
        return Result.skipped(f"the profile launches {algo or 'no speculative algorithm'}, not DDTREE")
    env = ctx.fact("env")
    value = (env.get("vars") or {}).get(GATE) if isinstance(env, dict) else None
    if value == "1":
        return Result.warned(
            f"{GATE}=1: SGLang will run the DDTree worker, which has not been validated inside a real server",
            "Compare the first outputs token for token with a non-speculative server (patch set README, "
            "'Validating on a real host') before serving traffic.", variable=GATE, value=value)
    env_file = ctx.expect("server.env_file", "/etc/k26-doctor/sglang-k26.env")
    return Result.failed(
        f"the profile launches DDTREE, but the patched SGLang refuses it without {GATE}=1 "
        "(its worker is not yet validated on a real host)",
        Remediation("Launch the DFlash chain instead (server.speculative_algorithm = \"DFLASH\" in the config), "
                    f"or opt in knowingly with {GATE}=1 in the service's environment file and validate "
                    "as sglang_patches/ddtree-0.5.23/README.md says.",
                    [f"echo '{GATE}=1' | sudo tee -a {env_file}"]),
        variable=GATE, value=value)
