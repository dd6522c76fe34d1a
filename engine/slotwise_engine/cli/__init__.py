"""The engine's ``slotwise`` commands, ``generate`` and ``bench``: entry points of the
``slotwise.cli_commands`` group, which the core's command line loads."""
