"""Model weights on disk, judged without a framework: safetensors headers, indexes, download leftovers,
hashes, manifests.

Pure functions over files, fast enough to run before every start: ``header`` reads only the first
bytes of a shard (never maps its data), ``index`` checks ``model.safetensors.index.json`` against the
headers, ``layout`` finds the files of a model directory (plain, ``hf download --local-dir``, the
Hugging Face cache) and what interrupted downloads left behind, ``hashing`` and ``manifest`` are the
deep tier (sha256 at disk speed with a verification cache), ``replica`` builds sparse copies of big
layouts for tests and benchmarks.
"""
