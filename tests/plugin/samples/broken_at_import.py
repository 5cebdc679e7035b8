"""A plug-in module that fails as it is imported: every class it would define is unloadable."""

raise RuntimeError("this plug-in's own bug, at import")
