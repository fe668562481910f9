"""``k26-doctor validate``: DDTree proven on the operator's own host, model, TP and stack.

``criteria`` (the one implementation of the losslessness and worth criteria: greedy identity with near-tie
probes, the sampled homogeneity test with its power control, refusals, worth), ``record`` (the site validation
record: format in ``doctor/data/ddtree_site_record.schema.json``, integrity, host identity, matching),
``siteconfig`` (the running configuration re-derived from the doctor's facts, as the patched server derives it),
and ``prompts``. The orchestration -- ``client`` (the /generate requests), ``servers`` (a server started
exactly as ``launch`` starts it, stopped with its process group) and ``run`` (the sequence, its state and resume,
the time budget) -- is ``doctor.service.validation``, beside the launcher it reuses.
"""
