"""The platform the custom-op tests dispatch on, defined here rather than taken from a
plugin: custom-op dispatch reads only its name, ``custom_op_key`` and default compiler."""

from __future__ import annotations

from slotwise.platforms import Platform


class CpuOpsPlatform(Platform):
    """A platform named "cpu" that runs ``CustomOp.forward_cpu`` and compiles with
    Inductor by default, as the CPU plugin's does."""

    name = "cpu"
    device_type = "cpu"
    custom_op_key = "cpu"
    default_compile_backend = "inductor"
