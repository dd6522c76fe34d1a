"""From a Dynamo graph to pieces: the backends torch.compile calls, the split at the
splitting ops (by FX or by Inductor's graph partition) and the piecewise backends that
run each capturable piece.

Holds no imports, so naming one module here loads only that module.
"""
