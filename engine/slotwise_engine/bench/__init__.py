"""The engine's benchmarks: decode speed against the memory roofline (``decode``) and
start-up time, cold and warm (``startup``), behind ``slotwise bench``."""
