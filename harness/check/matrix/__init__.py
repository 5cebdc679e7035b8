"""A scenario's runs and how each is judged: the cases (``case``), the expectations (``expect``), the verdict
against the reference run (``verdict``), one run judged alone (``judgement``) and the matrix that runs them."""
