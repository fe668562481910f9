"""The sglang area's domain library: its facts (``facts.py``) and the public helpers that its checks,
fixers and the launcher share: what the installed server accepts, read from its sources
(``flag_reader``, ``flag_validator``, ``flags``) and from the released history (``flag_history``)."""
