#!/usr/bin/env bash
# Read-only readings of a GPU host for the fabric and P2P checks, next to the doctor's own readings and
# verdicts, so that both can be compared on real hardware. Changes nothing (systemctl show, dpkg-query,
# lspci / setpci reads, sysfs); every command has a deadline.
#   bash bench/gpu_host_readings.sh [OUTDIR]
# Environment: PY (the doctor's interpreter, default python3), SERVICE_PY (the service's, with torch, for the
# --deep bandwidth probe; default PY), PROFILE (default h200-tp8), TP (default: the number of GPUs).
# Writes OUTDIR/gpu-host-readings.txt, OUTDIR/gpu-check.json and OUTDIR/gpu-readings-bench.json (default
# OUTDIR: $OUT or ./device-out).
set -u
cd "$(dirname "$0")/.." || exit 2
OUTDIR=${1:-${OUT:-./device-out}}
mkdir -p "$OUTDIR"
PY=${PY:-python3}
SERVICE_PY=${SERVICE_PY:-$PY}
PROFILE=${PROFILE:-h200-tp8}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 NO_COLOR=1
TIMEFORMAT="wall %R s"
NGPU=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
TP=${TP:-$([ "${NGPU:-0}" -gt 0 ] && echo "$NGPU" || echo 1)}
step() { echo; echo "== $* ($(date +%T))"; }
have() { command -v "$1" >/dev/null 2>&1; }

# The NVIDIA GPUs (display / 3D controllers) and the bridges above each, from sysfs.
gpus() {
  for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
    case "$(cat "$d/class" 2>/dev/null)" in 0x0300*|0x0302*) basename "$d" ;; esac
  done
}
bridges_of() {
  readlink -f "/sys/bus/pci/devices/$1" | tr '/' '\n' | grep -E '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$' \
    | grep -v "^$1\$"
}

{
step "host"
uname -r; echo "uid $(id -u)"; echo "cmdline: $(cat /proc/cmdline)"; echo "GPUs: ${NGPU:-0}, profile $PROFILE, tp $TP"

step "fabric state (nvidia-smi)"
timeout 30 nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,fabric.state,fabric.status \
  --format=csv 2>&1 || echo "(rc=$?)"
timeout 30 nvidia-smi -q 2>/dev/null | grep -i -A4 '^ *Fabric' | head -60

step "fabric manager and NVLSM (read-only)"
if have nv-fabricmanager; then timeout 5 nv-fabricmanager --version 2>&1; else echo "nv-fabricmanager: not on PATH"; fi
if have dpkg-query; then
  timeout 10 dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\n' 'nvidia-fabricmanager*' \
    'nvidia-fabric-manager*' 'cuda-drivers-fabricmanager*' nvlsm 2>&1 | head -20
fi
have rpm && timeout 10 rpm -qa 'nvidia-fabric*manager*' 'cuda-drivers-fabricmanager*' nvlsm 2>&1 | head -20
have systemctl && timeout 5 systemctl show -p Id,LoadState,ActiveState,SubState,UnitFileState \
  nvidia-fabricmanager.service nvlsm.service nvidia-nvlsm.service 2>&1
echo "processes: $(pgrep -a -x nvlsm 2>/dev/null; pgrep -a -x nv-fabricmanage 2>/dev/null)"
echo "ib_umad: $([ -d /sys/module/ib_umad ] && echo loaded || echo 'not loaded')"
ls -l /opt/nvidia/nvlsm/sbin/nvlsm 2>&1

step "IOMMU"
echo "units: $(ls /sys/class/iommu 2>/dev/null | tr '\n' ' ')"
echo "groups: $(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l)"
for g in $(gpus); do
  grp=$(basename "$(readlink "/sys/bus/pci/devices/$g/iommu_group" 2>/dev/null)" 2>/dev/null)
  echo "$g: $(readlink -f "/sys/bus/pci/devices/$g") group ${grp:-none} type $(cat \
    "/sys/kernel/iommu_groups/$grp/type" 2>/dev/null || echo '?')"
done

step "ACS of the bridges above each GPU (lspci, setpci reads; the extended space needs root)"
for g in $(gpus); do
  for b in $(bridges_of "$g"); do
    echo "-- $g <- $b ($(stat -c %s "/sys/bus/pci/devices/$b/config") byte config file)"
    have lspci && timeout 5 lspci -s "$b" -vvv 2>&1 | grep -E 'Access Control|ACSCap|ACSCtl'
    have setpci && echo "setpci ECAP_ACS+6.w (ACS control): $(timeout 5 setpci -s "$b" ECAP_ACS+6.w 2>&1)"
  done
done

step "the doctor's readings (doctor.gpu.pcie, doctor.gpu.fabric_software)"
timeout 60 "$PY" - <<'EOF'
import json
from doctor.gpu.fabric_software import read_fabric_software
from doctor.gpu.pcie import read_pcie

pcie = read_pcie()
for br, info in sorted(pcie["bridges"].items()):
    acs = info.get("acs") or {}
    off = acs.get("control_offset")
    print(f"{br}: config {info.get('config_bytes')} bytes, ACS present {acs.get('present')}, control "
          f"{'0x%04x' % acs['control'] if isinstance(acs.get('control'), int) else None} at "
          f"{hex(off) if isinstance(off, int) else None}, redirects {acs.get('redirects')}, error {acs.get('error')}")
print("iommu:", json.dumps(pcie["iommu"]))
print("gpus:", json.dumps(pcie["gpus"]))
print("fabric_software:", json.dumps(read_fabric_software(), indent=1))
EOF

step "the doctor's verdicts: check --only 'gpu.*' -v --format json (no wait)"
time timeout 180 "$PY" -m doctor check --profile "$PROFILE" --tp "$TP" --only 'gpu.*' -v --format json \
  --output "$OUTDIR/gpu-check.json" > /dev/null
echo "rc=$?"
"$PY" -c 'import json,sys; [print(r["status"].ljust(5), r["id"].ljust(20), r["summary"]) for r in
json.load(open(sys.argv[1]))["results"]]' "$OUTDIR/gpu-check.json"

step "cost of these readings against an isolated NVML reading (bench/bench_gpu_readings.py)"
timeout 120 "$PY" bench/bench_gpu_readings.py --repeat 7 --output "$OUTDIR/gpu-readings-bench.json"

step "fabric wait, bounded at 20 s: check --only gpu.fabric --wait-fabric 20"
time timeout 60 "$PY" -m doctor check --profile "$PROFILE" --tp "$TP" --only gpu.fabric --skip 'gpu.fabric.*' \
  --wait-fabric 20
echo "rc=$?"

if [ "${NGPU:-0}" -ge 2 ]; then
  step "deep bandwidth, one child per pair (--python $SERVICE_PY)"
  time timeout 420 "$PY" -m doctor check --profile "$PROFILE" --tp "$TP" --only gpu.p2p_bandwidth --deep \
    --python "$SERVICE_PY" -v
  echo "rc=$?"
  step "the same with pair 0-1 made to hang (test hook K26_DOCTOR_P2P_TEST_HANG): that pair fails, the run ends"
  time K26_DOCTOR_P2P_TEST_HANG=0-1 timeout 420 "$PY" -m doctor check --profile "$PROFILE" --tp "$TP" \
    --only gpu.p2p_bandwidth --deep --python "$SERVICE_PY"
  echo "rc=$?"
fi
step done
} 2>&1 | tee "$OUTDIR/gpu-host-readings.txt"
