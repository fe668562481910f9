"""The host area's domain library: its facts (``facts.py``) and the public helpers that its checks,
fixers and the launcher share."""
