"""SGLang: what the installed server accepts, read from its sources and from the released history."""
