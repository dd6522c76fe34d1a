"""``python -m slotwise`` is the ``slotwise`` command."""

from slotwise.cli import main

raise SystemExit(main())
