"""A stand-in ``sglang`` package for the sequencing tests of ``k26-doctor validate`` (tests/test_validate_run.py):
``python -m sglang.launch_server`` with the launcher's real argv serves SGLang's native /generate and /health from a
small deterministic language model. Faults per server role come from ``FAKE_SGLANG_FAULTS``."""
