"""Compiling once per machine: the compile cache and its keys (built in cache_key from
named factor groups, with graph fingerprints and the hardware identity), Inductor's cache
folder kept under slotwise's trust rules, and the CPU ISA probe answered from disk.

Holds no imports, so naming one module here loads only that module.
"""
