"""Reports: view models of a run's results (``views``, built by ``build``), and their renderers: terminal
text, JSON records, CSV and the verdict matrix, bench tables, and the HTML pages (``html`` over
``pages``, ``figures`` and ``slots``), plus the comparison of two result sets (``compare``)."""
