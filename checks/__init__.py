"""Built-in checks, one module per area; each module registers its checks with ``@check``."""
