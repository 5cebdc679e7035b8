"""Comparing two runs' KV caches: snapshots (``snapshot``), the diff (``diff``, over ``hashjoin``) and the
classification rules that name each bad slot (``rules``). Below ``run`` and ``matrix``: it knows no run."""
