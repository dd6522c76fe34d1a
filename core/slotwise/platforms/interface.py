"""``Platform``: what slotwise needs to know about and do with one kind of hardware.

A plain base class, not an ABC: a subclass that sets only ``name`` and
``device_type`` instantiates, and each method it does not override raises
``NotImplementedError`` naming the method and the platform.  A vendor grows a
plugin one method at a time.

Rules for subclasses:
- import heavy libraries (torch, a vendor SDK) inside methods, never at module level;
- every method accepts ``**kwargs`` and ignores what it does not know, so slotwise
  can pass new requirements later without breaking older plugins.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from slotwise import api_versioning

if TYPE_CHECKING:
    import torch

    from slotwise.compilation.config import CompilationConfig
    from slotwise.compilation.static_graphs.graph_api import GraphAPI

logger = logging.getLogger(__name__)


class Platform:
    """Base class of every platform; see the module docstring for the rules."""

    #: Platform name, as in ``SLOTWISE_PLATFORM=<name>``.  Override.
    name: str = ""
    #: torch device type tensors live on ("cpu", "cuda", "npu", ...).  Override.
    device_type: str = ""
    #: ``torch.distributed`` backend for this platform's communicator.
    dist_backend: str = "gloo"
    #: Environment variable that selects visible devices ("CUDA_VISIBLE_DEVICES");
    #: empty when the platform has none.
    device_control_env_var: str = ""
    #: Compiler used when ``CompilationConfig.backend`` is "" ("inductor" or "eager").
    default_compile_backend: str = "inductor"
    #: Which ``CustomOp.forward_<key>`` this platform runs ("native", "cpu", "cuda", "oot").
    custom_op_key: str = "native"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give a method defined under a deprecated name its new name too, with a warning.

        slotwise calls the new name only; aliasing it at class definition keeps a
        platform written before the rename working until the next major API version.
        """
        super().__init_subclass__(**kwargs)
        for old, (new, deprecated_in) in api_versioning.RENAMED_PLATFORM_METHODS.items():
            if old not in cls.__dict__:
                continue
            if new in cls.__dict__:
                message = f"{new}() is used and {old}() is ignored; remove {old}()"
            else:
                setattr(cls, new, cls.__dict__[old])
                removed_in = api_versioning.removal_version(deprecated_in)
                message = f"rename it to {new}() (the old name stops working in API {removed_in})"
            warnings.warn(
                f"{cls.__module__}.{cls.__qualname__} defines {old}(), renamed {new}() in "
                f"slotwise API {deprecated_in}: {message}",
                DeprecationWarning,
                # type.__new__ runs this hook without a Python frame of its own, so the
                # caller's frame is the class statement.
                stacklevel=2,
            )

    def __init__(self) -> None:
        if not self.name or not self.device_type:
            raise TypeError(
                f"{type(self).__name__} must set the class attributes 'name' and 'device_type'"
            )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} device_type={self.device_type!r}>"

    def _not_implemented(self, method: str, hint: str = "") -> NoReturn:
        message = f"platform {self.name!r} ({type(self).__name__}) does not implement {method}()"
        raise NotImplementedError(message + (f"; {hint}" if hint else ""))

    # -- devices -------------------------------------------------------------------

    def device_count(self, **kwargs: Any) -> int:
        """Number of devices visible to this process.  Override."""
        self._not_implemented("device_count")

    def get_device_name(self, device_id: int = 0, **kwargs: Any) -> str:
        """Marketing name of device ``device_id`` ("NVIDIA H200").  Override."""
        self._not_implemented("get_device_name")

    def get_device_capability(self, device_id: int = 0, **kwargs: Any) -> tuple[int, int] | None:
        """Compute capability as (major, minor), or None where the notion does not apply."""
        self._not_implemented("get_device_capability")

    def device_identity(self, **kwargs: Any) -> dict[str, str]:
        """What code compiled for this process's device is specialised to, as strings.

        slotwise keys its compile cache, Inductor's cache folder and warm starts on it,
        and never probes a vendor's device itself: a cache may be shared between machines
        (a network home) or copied, and code compiled for one device generation can run
        wrongly on another. Override to add what your compiler specialises to (device
        model, compute capability, driver and runtime versions), starting from
        ``super().device_identity()``; the same device must give the same answer in every
        process. The default names only the platform, its device type and torch.
        """
        import torch

        return {"platform": self.name, "device_type": self.device_type, "torch": torch.__version__}

    def total_memory(self, device_id: int = 0, **kwargs: Any) -> int:
        """Total memory of device ``device_id`` in bytes.  Override."""
        self._not_implemented("total_memory")

    def current_memory_usage(self, device_id: int = 0, **kwargs: Any) -> int:
        """Bytes this process currently holds on the device.  Override."""
        self._not_implemented("current_memory_usage")

    def set_device(self, device_id: int, **kwargs: Any) -> None:
        """Make ``device_id`` this process's current device.  Override."""
        self._not_implemented("set_device")

    def synchronize(self, **kwargs: Any) -> None:
        """Wait for all work queued on the current device.  Override."""
        self._not_implemented("synchronize")

    def seed_everything(self, seed: int, **kwargs: Any) -> None:
        """Seed Python, NumPy (if installed) and torch; override to seed a vendor RNG too."""
        import random

        import torch

        random.seed(seed)
        try:
            import numpy
        except ImportError:
            pass
        else:
            numpy.random.seed(seed)
        torch.manual_seed(seed)

    # -- implementations -----------------------------------------------------------

    def get_attention_backend_cls(
        self, selected: str | None = None, **requirements: Any
    ) -> type | None:
        """An attention backend class chosen by the platform itself, or None (the default).

        None lets slotwise choose among the backends plugins register for this platform
        (hook ``slotwise_register_attention_backends``): ``selected`` or
        SLOTWISE_ATTENTION_BACKEND first, else the first by priority whose ``validate``
        passes. Return a class only to take that choice over.
        """
        return None

    def get_communicator_cls(self, **kwargs: Any) -> type | None:
        """A ``Communicator`` subclass for a vendor collective library, or None (the
        default): the base ``Communicator``, collectives through torch.distributed with
        ``dist_backend``."""
        return None

    def get_graph_api(self, **kwargs: Any) -> GraphAPI | None:
        """The platform's static graphs (CUDA graphs, NPU graphs), or None without any.

        slotwise builds its static-graph wrappers and capturing piecewise backend
        around it, so every platform keeps one contract.  Return the same object on
        every call: its pool is shared by all graphs of the process.  None (the
        default) leaves graph_mode NONE only.
        """
        return None

    def get_piecewise_backend_cls(self, **kwargs: Any) -> type | None:
        """An ``AbstractPiecewiseBackend`` subclass to run every piece at level 3, or None.

        None (the default) lets slotwise choose, which is what platforms want:
        ``CompiledPiecewiseBackend``, capturing through ``get_graph_api()`` in graph
        modes with piecewise graphs.  Return a class only for full control of the
        pieces; it is constructed as ``AbstractPiecewiseBackend`` documents, with
        ``graph_api=get_graph_api()``.
        """
        return None

    # -- memory --------------------------------------------------------------------

    def advise_resident_memory(self, tensors: Sequence[torch.Tensor], **kwargs: Any) -> None:
        """Learn which tensors stay for the whole run and are read by every step (the
        weights, the KV cache); the default does nothing.

        A decode step streams all of them from memory, so how their memory is mapped
        sets its speed: the CPU platform moves them onto huge pages here.  A platform may
        change the mapping, never a tensor's address, values or layout (compiled code
        and captured graphs hold those).  Called, possibly more than once for the same
        tensors, by ``load_model`` on the weights before the checkpoint is read into
        them, by ``ModelRunner`` on the weights of any model, by ``allocate_kv_caches``
        on each KV cache before it is zeroed, and by the decode benchmark on its
        bandwidth probe's buffer, so the roofline is read from memory placed the same way.
        """

    # -- configuration -------------------------------------------------------------

    def check_and_update_config(self, config: CompilationConfig, **kwargs: Any) -> None:
        """Adapt ``config`` to this platform (add splitting ops, pick a backend); the
        default changes nothing.

        Called once per compiled model, before slotwise fills in what is still unset
        (the platform's ``default_compile_backend``, the graph mode its ``GraphAPI``
        allows) and refuses what cannot work. slotwise logs every field that changes.
        """
