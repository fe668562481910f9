"""Probe: whether each GPU the service sees supports NVLink multicast, as the CUDA driver itself says.

``cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)`` through the ``libcuda.so.1`` the service's
loader resolves, after ``cuInit(0)``: the same attribute FlashInfer's symmetric memory and torch's
``deviceSupportsMulticast`` read before they raise "Device does not support multicasting". Reading an
attribute creates no context, allocates nothing and never creates a multicast object (``cuMulticastCreate``
can put a shared host's NVSwitch multicast resources out of reach of others: this probe never calls it).
Each device is named by its PCI bus id, so that the doctor matches it to NVML's reading.

Run by ``doctor.core.proc.run_probe`` with the service's environment (``CUDA_VISIBLE_DEVICES``,
``LD_LIBRARY_PATH``). Stdlib only, Python >= 3.8. Prints one JSON object on the last line.

    python multicast.py
"""

import ctypes
import json
import sys

CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 132  # cuda.h, CUDA 12.1+


def error_name(lib, rc):
    """``CUDA_ERROR_SYSTEM_NOT_READY`` for 802, from the driver itself (None when it has no name)."""
    name = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode(errors="replace")
    except (AttributeError, OSError):
        return None
    return None


def device(lib, ordinal):
    dev = ctypes.c_int(0)
    rc = lib.cuDeviceGet(ctypes.byref(dev), ordinal)
    out = {"ordinal": ordinal}
    if rc != 0:
        out.update(rc=rc, error=error_name(lib, rc) or f"error {rc}", call="cuDeviceGet")
        return out
    bus = ctypes.create_string_buffer(64)
    if lib.cuDeviceGetPCIBusId(bus, 64, dev) == 0:
        out["pci_bus_id"] = bus.value.decode(errors="replace")
    value = ctypes.c_int(-1)
    rc = lib.cuDeviceGetAttribute(ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, dev)
    if rc != 0:  # an old driver without the attribute says CUDA_ERROR_INVALID_VALUE
        out.update(rc=rc, error=error_name(lib, rc) or f"error {rc}", call="cuDeviceGetAttribute")
    else:
        out["multicast_supported"] = bool(value.value)
    return out


def main():
    doc = {"ok": True, "python": sys.executable, "attribute": CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        doc.update(loaded=False, error=str(exc))
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    doc["loaded"] = True
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
        doc["cuda_driver"] = version.value
    rc = lib.cuInit(0)
    doc["cu_init"] = rc
    if rc != 0:
        doc["cu_init_error"] = error_name(lib, rc) or f"error {rc}"
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        doc["count_error"] = error_name(lib, rc) or f"error {rc}"
        count.value = 0
    doc["devices"] = [device(lib, i) for i in range(count.value)]
    sys.stdout.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main()
