"""The model area: the target's and the drafter's files as the server will load them, judged without a
framework.

Pure functions over files, fast enough to run before every start: ``header`` reads only the first
bytes of a shard (never maps its data), ``index`` checks ``model.safetensors.index.json`` against the
headers, ``layout`` finds the files of a model directory (plain, ``hf download --local-dir``, the
Hugging Face cache) and what interrupted downloads left behind, ``hashing`` and ``manifest`` are the
deep tier (sha256 at disk speed with a verification cache). ``tokenizer`` judges the tokenizer files and
their load in the service's interpreter (``tiktoken_bpe``, ``remote_code``), ``drafter`` the drafter
against the target and the server command. The sparse replicas tests and benchmarks use are built by
``tests/model_replica.py``.
"""
