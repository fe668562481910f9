"""Host checks: free disk where the service writes, the server port, the service's environment, and who can reach
the server. Each maps the facts ``disk``, ``port`` and ``env`` (``doctor/host/facts.py``), or the server arguments
the launcher builds, to the judgements of ``doctor/host/``.
"""

from __future__ import annotations

from doctor.core.context import Context
from doctor.core.registry import check
from doctor.core.result import Result
from doctor.host import disk, environment, exposure, jitcache, port, shm


@check("host.disk", "Free space where caches, logs and temp files are written", needs=("disk",), failure="node")
def host_disk(ctx: Context) -> Result:
    """Free space (and writability) where the service writes: the Triton cache (TRITON_CACHE_DIR or
    ~/.triton/cache), TMPDIR, and the profile's [host] paths.

    Why: Triton compiles kernels into its cache at first use and the server writes logs; a full or
    read-only disk shows up minutes into a start as an obscure compile or write error.
    Fix by hand: free space (`du -xsh /path/* | sort -h`), or point TRITON_CACHE_DIR / TMPDIR at a
    roomier filesystem in the service's environment file.
    """
    return Result.of(disk.judge_disk(ctx.fact("disk"), ctx.settings))


@check("host.shm", "/dev/shm size and free space for the TP group's shared memory", needs=("shm",),
       failure="node", applies=("start", "serving"))
def host_shm(ctx: Context) -> Result:
    """Size and free space of /dev/shm (statvfs; the mount from /proc/self/mountinfo) against an estimate
    for the ranks of the profile (doctor/data/shm_estimate.toml: NCCL's shared-memory transport buffers per
    channel and peer, NCCL's per-rank segment, SGLang's broadcast queue; each with its source).

    Why: containers get a 64 MB /dev/shm by default; at TP8 NCCL needs hundreds of MiB there and the server
    dies in NCCL's init with "Error while creating shared memory segment /dev/shm/nccl-... (size 9637888)",
    "No space left on device". Segments a crashed server left behind fill it too (the check lists them).
    Fix by hand, where the service runs: docker/podman `--shm-size=1g` (or `--ipc=host`); Kubernetes: an
    `emptyDir` with `medium: Memory` and a `sizeLimit` mounted at /dev/shm; a host: `mount -o
    remount,size=1G /dev/shm` and /etc/fstab. No fixer: a remount of a shared /dev/shm, or a container's
    recreation, is the operator's to do."""
    return Result.of(shm.judge_shm(ctx.fact("shm"), ctx.settings))


@check("host.jit_cache", "The JIT caches survive a reboot and the service's user can write them",
       needs=("jit_caches",), fixer="host.jit_cache", failure="deployment", applies=("start", "serving"))
def host_jit_cache(ctx: Context) -> Result:
    """Where FlashInfer (FLASHINFER_WORKSPACE_BASE, else SGLANG_CACHE_DIR, else ~/.cache/sglang), Triton
    (TRITON_CACHE_DIR, else ~/.triton/cache) and SGLang keep what they compile for the service: the filesystem of
    each (/proc/self/mountinfo), whether systemd-tmpfiles empties it at boot (`D /tmp` in tmpfiles.d: /tmp on a
    disk too, on Debian and Ubuntu), and whether the service's user ([server] user, else the doctor's) may write
    there.

    Why: an empty cache costs every start minutes on the H200 (FlashInfer's sampling and norm modules ~147 s,
    the Triton kernels of a DDTree server's CUDA-graph captures ~130 s). A cache on tmpfs is empty after every
    boot; one the service cannot write is compiled again at every start. It warns: the start still works.
    Fix by hand: a directory on a persistent disk owned by the service's user (`install -d -o USER
    /var/cache/sglang-k26/triton`), named in the service's environment file (TRITON_CACHE_DIR=...,
    FLASHINFER_WORKSPACE_BASE=...).
    """
    return Result.of(jitcache.judge_jit_cache(ctx.fact("jit_caches")))


@check("host.port", "The server port is free", needs=("port",), failure="node", applies=("start",))
def host_port(ctx: Context) -> Result:
    """Binds the server's host:port as SGLang will (SO_REUSEADDR) and releases it at once.

    Why: a stale server (or another service) on port 30000 makes SGLang fail with "Address already
    in use" only after minutes of loading weights.
    Fix by hand: stop the owner (`ss -ltnp 'sport = :30000'`), or choose another port in the config.
    """
    return Result.of(port.judge_port(ctx.fact("port")))


@check("host.env", "Environment variables that break or slow the service", needs=("env",),
       failure="deployment", applies=("start", "serving"))
def host_env(ctx: Context) -> Result:
    """The service's environment (this process's, the profile's [server.env] and the profile's
    EnvironmentFile) against a table of variables known to break or slow SGLang/NCCL
    (doctor/data/env_rules.toml): NCCL_P2P_DISABLE=1, CUDA_LAUNCH_BLOCKING=1, TRITON_INTERPRET=1,
    CUDA_VISIBLE_DEVICES with fewer GPUs than the TP group, and more. It warns on a PATH with empty entries (a
    leading or trailing ':', a '::': each searches the working directory, so which nvcc or ninja a JIT build
    runs depends on where the service starts) and on a CUDA_HOME / CUDA_PATH that is set empty, holds a search
    path, or names a directory without bin/nvcc or include/cuda_runtime.h.

    Why: these are debugging switches or site leftovers that turn TP8 over NVLink into something
    many times slower, or hide GPUs, without any error message.
    Fix by hand: unset them in /etc/environment, the unit's Environment= and its EnvironmentFile.
    """
    return Result.of(environment.judge_env(ctx.fact("env"), ctx.settings.world_size))


@check("host.exposure", "The server listening beyond loopback without an API key",
       failure="deployment", applies=("start", "serving"))
def host_exposure(ctx: Context) -> Result:
    """Reads the server arguments the launcher will use (the profile's [server] host, api_key and args):
    a server bound beyond loopback (0.0.0.0, ::, a routable address or a host name) without --api-key
    serves the model to anyone who can reach the port.

    Why: SGLang's HTTP API has no authentication unless --api-key is given; the profiles bind 0.0.0.0
    so that other hosts can reach it. Fix by hand: require a key ([server] api_key in the config, which
    the launcher passes as --api-key; keep that file mode 0640), or bind 127.0.0.1 behind a reverse proxy
    that authenticates ([server] host = "127.0.0.1")."""
    return Result.of(exposure.judge_exposure(*ctx.server_args, ctx.settings))
