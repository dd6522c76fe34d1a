"""Helpers for testing slotwise and its plugins: toy models with splitting ops, and the
platform conformance suite (``conformance``, run through ``pytest_plugin``)."""

#: Seconds each test of the conformance suite may run unless told otherwise (``pytest
#: --slotwise-timeout``, ``slotwise conformance --timeout``): above the communicator
#: check's own 240 s deadline, far above any test of a sound platform.  Here, where both
#: the pytest plugin and the command read it without importing the suite.
CONFORMANCE_TIME_LIMIT_S = 300.0
