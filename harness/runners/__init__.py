"""Runners: how one ``ForwardBatch`` reaches the model, eagerly (``eager.py``) or through captured graphs
(``decode_graph.py``, ``piecewise.py``), all over one ``RunnerContext`` (``base.py``)."""
