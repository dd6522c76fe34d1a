"""The torch side of the "foreign" test device, as a vendor's torch extension ships it.

Installed as ``foreign_torch`` (conftest.py).  Importing it loads the compiled backend
(``foreign_device.so``, built from ``csrc/foreign_device.cpp`` and copied beside this
file), renames torch's PrivateUse1 backend to "foreign", adds the ``Tensor.foreign()``
family of methods and registers ``torch.foreign`` (``runtime.py``).  After that,
``torch.device("foreign:1")`` is a device like any other, which is what a vendor's
package (torch_npu, ...) does on import.
"""

from __future__ import annotations

from pathlib import Path

import torch

#: The device type, as in ``torch.device("foreign")``.
DEVICE_TYPE = "foreign"

torch.ops.load_library(Path(__file__).with_name("foreign_device.so"))
torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
torch.utils.generate_methods_for_privateuse1_backend(
    for_tensor=True, for_module=True, for_packed_sequence=False, for_storage=True
)

from foreign_torch import runtime  # noqa: E402  (needs the device type above)

torch._register_device_module(DEVICE_TYPE, runtime)
