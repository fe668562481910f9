"""SGLang patch sets (``sglang_patches/<name>/``: a manifest and unified diffs) as package data."""
