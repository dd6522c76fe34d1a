"""Static graphs (CUDA graphs, NPU graphs): the ``GraphAPI`` a platform implements, the
contract every graph platform keeps, the wrapper that captures and replays per size, the
recorded graphs that simulate them, and the rule for which graph mode acts where.

Holds no imports, so naming one module here loads only that module.
"""
