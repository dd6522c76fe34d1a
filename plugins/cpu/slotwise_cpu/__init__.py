"""slotwise platform plugin for CPUs: always available, lowest priority."""
