"""A stand-in for a vendor NPU that runs on the CPU.

Copy this package to start a vendor plugin: ``plugin.py`` announces the platform,
``platform.py`` implements it.  Nothing here imports another slotwise plugin.
"""
