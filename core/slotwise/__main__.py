"""``python -m slotwise`` is the ``slotwise`` command."""

if __name__ == "__main__":
    from slotwise.cli import main

    raise SystemExit(main())
