"""``k26-doctor env``: a short, paste-ready summary of the host for a bug report (as ``collect_env`` users
expect): driver and CUDA, GPUs and how they are linked, the service's torch / triton / SGLang / kernel
packages, the Linux kernel, the environment variables that matter, and the profile's verdict.

A pure function of the facts of a run and its report, so it works live and from a snapshot alike;
everything printed goes through the redaction of ``doctor.facts.redaction`` (URL credentials, tokens).
"""

from __future__ import annotations

import os
import platform
from typing import Any

from doctor import __version__
from doctor.core.printable import printable
from doctor.facts.redaction import redact, redact_text
from doctor.gpu import links

PACKAGES = ("torch", "triton", "sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python", "flashinfer-cubin",
            "flashinfer-jit-cache", "nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-cuda-runtime-cu12",
            "nvidia-cuda-runtime", "transformers", "nvidia-ml-py", "safetensors")
ENV_PREFIXES = ("CUDA_", "NCCL_", "TRITON_", "SGLANG_", "TORCH_", "NVIDIA_", "HF_", "LD_LIBRARY_PATH", "PYTORCH_",
                "OMP_NUM_THREADS", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy")
GIB = 1024 ** 3


def _fact(facts: Any, name: str) -> dict[str, Any]:
    """A fact this run collected (or recorded) when it is a JSON object; ``{}`` when it is not there or is
    something else (a snapshot with a fact of the wrong type): ``env`` says "not read", never crashes."""
    try:
        value = facts.get(name)
    except Exception:  # FactUnavailable, MalformedFact: shown as not read, never a crash of a bug-report helper
        return {}
    return value if isinstance(value, dict) else {}


def _obj(value: Any, *keys: str) -> dict[str, Any]:
    """``value[k1][k2]...`` when every step is a JSON object, else ``{}``."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else {}


def _scalar(value: Any) -> Any:
    """A value shown as it is only when it is a string, number or boolean (None otherwise)."""
    return value if isinstance(value, (str, int, float, bool)) else None


def _strings(value: Any) -> list[str] | None:
    return [str(v) for v in value if isinstance(v, (str, int))] if isinstance(value, list) else None


def os_release() -> str:
    from doctor.core.fileio import read_text

    try:
        for line in read_text("/etc/os-release", 1 << 16, "an os-release file", errors="replace").splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "unknown"


def _gpu(d: dict[str, Any]) -> dict[str, Any]:
    cc = d.get("compute_capability")
    total = _obj(d, "memory").get("total")
    return {"index": _scalar(d.get("index")), "name": _scalar(d.get("name")),
            "cc": ".".join(str(x) for x in cc if isinstance(x, int)) or None if isinstance(cc, list) else None,
            "memory_gib": round(total / GIB, 1) if isinstance(total, (int, float)) and not isinstance(total, bool)
            else 0,
            "mig": _scalar(_obj(d, "mig_mode").get("current")),
            "nvlinks_active": _scalar(_obj(d, "nvlink").get("active"))}


def _devices(nvml: dict[str, Any]) -> list[dict[str, Any]]:
    """The recorded GPUs that are objects (a recorded list of the wrong type is no GPU, never a crash)."""
    raw = nvml.get("devices")
    return [d for d in raw if isinstance(d, dict)] if isinstance(raw, list) else []


def _topology(nvml: dict[str, Any], devices: list[dict[str, Any]]) -> list[str]:
    """The GPU link matrix's rows (more than one GPU), or none when the recorded links are of the wrong type."""
    try:
        return links.matrix(nvml, devices) if len(devices) > 1 else []
    except (TypeError, ValueError, KeyError, AttributeError):  # recorded links of the wrong type
        return []


def _host_section(live: bool) -> dict[str, Any]:
    """This machine's OS when run live; a replayed snapshot is not this machine, so it says so instead."""
    if not live:
        return {"recorded": "see the snapshot"}
    return {"kernel": platform.release(), "machine": platform.machine(), "os": os_release(),
            "libc": " ".join(platform.libc_ver())}


def _driver_section(nvml: dict[str, Any]) -> dict[str, Any]:
    """The driver as NVML read it; its CUDA version as ``12.8`` from NVML's integer (12080)."""
    cuda_drv = nvml.get("cuda_driver_version")
    return {"available": bool(nvml.get("available")), "version": _scalar(nvml.get("driver_version")),
            "kernel_module": _scalar(nvml.get("kernel_module_version")),
            "cuda": f"{cuda_drv // 1000}.{cuda_drv % 1000 // 10}"
            if isinstance(cuda_drv, int) and not isinstance(cuda_drv, bool) else None,
            "error": _scalar(nvml.get("error"))}


def _torch_section(torch: dict[str, Any]) -> dict[str, Any] | None:
    """torch as imported (--deep or a recording with ``torch_info``), or None when it was not."""
    if not torch:
        return None
    return {"version": _scalar(torch.get("version")), "cuda": _scalar(torch.get("cuda")),
            "arch_flags": _strings(torch.get("arch_flags")),
            "cuda_available": _scalar(torch.get("cuda_available")),
            "error": _scalar(torch.get("error"))}


def _verdict_section(report: Any) -> dict[str, Any]:
    """The run's verdict and the check ids it names, so a pasted summary says what failed without the report."""
    return {"status": report.decision().status.value, "counts": report.counts(),
            "failed": [r.id for r in report.results if r.status.failed],
            "warned": [r.id for r in report.results if r.status.value == "warn"],
            "unjudged": [r.id for r in report.unjudged]}


def collect_summary(report: Any, facts: Any, live: bool) -> dict[str, Any]:
    """The summary as data (``--format json``), redacted. Every value is read defensively: a recorded fact
    of the wrong type is left out, never a crash."""
    s = report.settings
    nvml = _fact(facts, "nvml")
    stack = _fact(facts, "stack")
    torch = _fact(facts, "torch_info")
    env = {str(k): str(v) for k, v in _obj(_fact(facts, "env"), "vars").items() if _scalar(v) is not None}
    devices = _devices(nvml)
    dists = _obj(stack, "distributions")
    py = _obj(stack, "python")
    out: dict[str, Any] = {
        "doctor": {"version": __version__, "profile": s.profile_name, "tp": s.tp,
                   "from_snapshot": s.from_snapshot},
        "host": _host_section(live),
        "driver": _driver_section(nvml),
        "gpus": [_gpu(d) for d in devices],
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "topology": _topology(nvml, devices),
        "python": {"service": s.python, "service_version": _scalar(py.get("version")),
                   "in_venv": _scalar(py.get("in_venv")), "doctor_version": platform.python_version()},
        "torch": _torch_section(torch),
        "packages": {name: _scalar(_obj(dists, name).get("version")) for name in PACKAGES if _obj(dists, name)},
        "env": {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)},
        "verdict": _verdict_section(report),
    }
    return redact(out)


def render_summary(data: dict[str, Any]) -> str:
    """The paste-ready text: one fact per line, in a fenced block; values from the host escaped
    (``doctor.core.printable``)."""
    return printable(_summary_text(data), lines=True)


def _machine_lines(data: dict[str, Any]) -> list[str]:
    """The summary's OS, driver, GPU and topology lines: kept apart from ``_summary_text`` so each part of the
    summary reads on its own."""
    drv = data["driver"]
    lines = []
    host = data["host"]
    if "kernel" in host:
        lines.append(f"OS:        {host['os']}, Linux {host['kernel']} {host['machine']}, {host['libc']}".rstrip(", "))
    if drv["available"]:
        lines.append(f"driver:    {drv['version']} (kernel module {drv['kernel_module'] or '?'}), "
                     f"CUDA {drv['cuda'] or '?'}")
    else:
        lines.append(f"driver:    not available ({drv.get('error') or 'no NVML reading'})")
    gpus = data["gpus"]
    if gpus:
        kinds: dict[str, int] = {}
        for g in gpus:
            key = f"{g['name']} (sm_{str(g['cc'] or '?').replace('.', '')}, {g['memory_gib']} GiB)"
            kinds[key] = kinds.get(key, 0) + 1
        lines.append("GPUs:      " + "; ".join(f"{n}x {k}" for k, n in kinds.items())
                     + f"; CUDA_VISIBLE_DEVICES={data['cuda_visible_devices'] or 'unset'}")
        mig = [str(g["index"]) for g in gpus if g.get("mig")]
        if mig:
            lines.append(f"MIG:       on for GPU {', '.join(mig)}")
    else:
        lines.append("GPUs:      none visible")
    if data["topology"]:
        lines.append("topology:")
        lines.extend("  " + row for row in data["topology"] if row.strip() and not row.startswith("Legend"))
    return lines


def _software_lines(data: dict[str, Any]) -> list[str]:
    """The summary's python, torch, package and environment lines: kept apart from ``_summary_text`` so each
    part of the summary reads on its own."""
    py = data["python"]
    lines = [f"python:    service {py['service']} ({py.get('service_version') or '?'}"
             + (", venv" if py.get("in_venv") else "") + f"); doctor {py['doctor_version']}"]
    t = data.get("torch")
    if t and t.get("version"):
        lines.append(f"torch:     {t['version']} (CUDA {t.get('cuda') or 'none'}, archs "
                     f"{' '.join(t.get('arch_flags') or []) or '?'}, cuda_available={t.get('cuda_available')})")
    elif t and t.get("error"):
        lines.append(f"torch:     not importable ({str(t['error'])[:160]})")
    pk = data["packages"]
    lines.append("packages:  " + (", ".join(f"{k} {v}" for k, v in pk.items()) if pk else "none of the stack's"))
    if data["env"]:
        lines.append("env:       " + " ".join(f"{k}={v}" for k, v in data["env"].items()))
    return lines


def _summary_text(data: dict[str, Any]) -> str:
    """The pasteable summary, redacted: header, machine, software, then the verdict and what it names."""
    d = data["doctor"]
    lines = ["```", f"k26-doctor {d['version']} env (redacted)   profile {d['profile']}, TP{d['tp']}"
             + (f", from snapshot {os.path.basename(str(d['from_snapshot']))}" if d.get("from_snapshot") else "")]
    lines += _machine_lines(data)
    lines += _software_lines(data)
    v = data["verdict"]
    c = v["counts"]
    lines.append(f"verdict:   {v['status'].upper()} ({c['pass']} passed, {c['warn']} warnings, {c['fail']} failed, "
                 f"{c['skip']} skipped, {c['error']} errors)")
    for key, label in (("failed", "failed"), ("warned", "warnings"), ("unjudged", "not judged")):
        if v[key]:
            lines.append(f"  {label}: {', '.join(v[key])}")
    lines.append("```")
    return redact_text("\n".join(lines)) + "\n"
