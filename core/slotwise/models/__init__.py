"""Reference models built from slotwise layers (Attention, CustomOps)."""
