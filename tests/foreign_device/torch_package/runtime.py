"""``torch.foreign``: the device module torch and user code call for the "foreign" device.

The same names as ``torch.cuda``'s where torch looks them up for a PrivateUse1
backend (seeding, device counts, AMP), backed by the compiled runtime calls of
``torch.ops.foreign_device``.
"""

from __future__ import annotations

import torch

_ops = torch.ops.foreign_device
_UINT64 = 1 << 64


def _index(device: int | str | torch.device | None) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return current_device() if device.index is None else device.index


def is_available() -> bool:
    return device_count() > 0


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """Nothing to initialise: the runtime is ready once the library is loaded."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _ops.device_count()


def current_device() -> int:
    return _ops.current_device()


def set_device(device: int | str | torch.device) -> None:
    _ops.set_device(_index(device))


def synchronize(device: int | str | torch.device | None = None) -> None:
    """Work runs synchronously on this device; only the index is checked."""
    index = _index(device)
    if not 0 <= index < device_count():
        raise RuntimeError(f"foreign device {index} does not exist")


def get_device_name(device: int | str | torch.device | None = None) -> str:
    return f"foreign test device {_index(device)}"


def memory_allocated(device: int | str | torch.device | None = None) -> int:
    return _ops.memory_allocated(_index(device))


def _signed(seed: int) -> int:
    """A seed as torch takes it (any 64-bit pattern), as the int64 the op takes."""
    seed = int(seed) % _UINT64
    return seed - _UINT64 if seed >= 1 << 63 else seed


def manual_seed(seed: int) -> None:
    _ops.manual_seed(current_device(), _signed(seed))


def manual_seed_all(seed: int) -> None:
    for index in range(device_count()):
        _ops.manual_seed(index, _signed(seed))


def initial_seed() -> int:
    return _ops.initial_seed(current_device()) % _UINT64


def get_rng_state(device: int | str | torch.device = "foreign") -> torch.Tensor:
    return _ops.get_rng_state(_index(device))


def set_rng_state(new_state: torch.Tensor, device: int | str | torch.device = "foreign") -> None:
    _ops.set_rng_state(_index(device), new_state)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def is_bf16_supported() -> bool:
    return True
