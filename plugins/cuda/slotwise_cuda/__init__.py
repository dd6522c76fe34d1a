"""slotwise platform plugin for NVIDIA GPUs."""
