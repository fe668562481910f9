"""`k26-doctor validate`'s orchestration: the servers started as `launch` starts them (``servers``), the requests
(``client``) and the sequence with its state and resume (``run``). What the gate and the record share with the
judgement (the criteria, the record, the site configuration, the prompts) is the sglang area's library,
``doctor.sglang.validation``: this package sits above it, beside the launcher it reuses."""
