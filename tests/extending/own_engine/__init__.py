"""An engine engineer's own code, written outside the harness against its public contracts and named by import
path (``tests.extending.own_engine.designs:translating``): the plug-ins the tests of issue 26 judge."""
