"""Attention backends behind one contract (``base.py``): ``torch_native`` runs anywhere; the registry
(``registry.py``) names them."""
