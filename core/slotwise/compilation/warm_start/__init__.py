"""Warm starts: a process whose model was traced before rebuilds it without Dynamo. The
store, the checks that stand in for Dynamo's guards, the unguarded
facts compared across processes, and the paths that reach each value a trace read.

Holds no imports, so naming one module here loads only that module.
"""
