"""One run: assembling it from its spec (``assemble``), driving its steps (``drive``), what it gives
(``result``, ``frames``), the isolated worker processes that run it (``workers``) and the dense oracle."""
