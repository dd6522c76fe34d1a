"""The foreign test device works with plain torch, so what fails on it in slotwise is slotwise's.

Every op the backend does not implement runs through torch's CPU fallback, the same
CPU kernels as on the host: results are compared exactly with the host's.
"""

from __future__ import annotations

import textwrap

import pytest
from foreign_runs import run_python

pytestmark = pytest.mark.slow


def check(site, code: str, **env: str) -> None:
    result = run_python(site, "import torch, foreign_torch\n" + textwrap.dedent(code), **env)
    assert result.returncode == 0, result.stderr[-4000:]


def test_tensors_live_on_the_device_and_copy_back_exactly(foreign_site):
    check(
        foreign_site,
        """
        assert torch.accelerator.current_accelerator().type == "foreign"
        assert torch.foreign.device_count() == torch.accelerator.device_count() == 2
        host = torch.randn(5, 7)
        x = host.to("foreign")
        assert x.device == torch.device("foreign", 0) and x.is_foreign and not x.is_cpu
        assert torch.equal(x.cpu(), host) and torch.equal(x.to("foreign:1").cpu(), host)
        assert x.to(torch.bfloat16).to("cpu").equal(host.to(torch.bfloat16))
        # non_blocking copies to the host land in the device's pinned host memory
        staged = x.to("cpu", non_blocking=True)
        assert staged.is_pinned() and torch.equal(staged, host)
        assert x.tolist() == host.tolist() and x[1, 2].item() == host[1, 2].item()
        """,
    )


def test_memory_is_counted_on_the_device_that_holds_it(foreign_site):
    check(
        foreign_site,
        """
        before = [torch.foreign.memory_allocated(i) for i in range(2)]
        x = torch.empty(1024, device="foreign:1")
        assert torch.foreign.memory_allocated(1) == before[1] + 4096
        assert torch.foreign.memory_allocated(0) == before[0]
        torch.foreign.set_device(1)
        assert torch.zeros(3, device="foreign").device == torch.device("foreign", 1)
        del x
        assert torch.foreign.memory_allocated(1) == before[1]
        try:
            torch.zeros(1, device="foreign:2")
        except RuntimeError as error:
            assert "foreign device 2 does not exist" in str(error), error
        else:
            raise AssertionError("a third device was accepted")
        """,
    )


def test_ops_through_the_cpu_fallback_give_the_hosts_results(foreign_site):
    check(
        foreign_site,
        """
        torch.manual_seed(0)
        a, b = torch.randn(6, 8), torch.randn(8, 5)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x, y = a.to(dtype), b.to(dtype)
            fx, fy = x.to("foreign"), y.to("foreign")
            assert torch.equal((fx @ fy).cpu(), x @ y), dtype
            assert torch.equal(torch.softmax(fx.float(), -1).cpu(), torch.softmax(x.float(), -1))
            assert torch.equal(torch.nn.functional.silu(fx).cpu(), torch.nn.functional.silu(x))
        index = torch.tensor([4, 0, 2])
        f = a.to("foreign")
        assert torch.equal(f.index_select(0, index.to("foreign")).cpu(), a.index_select(0, index))
        assert torch.equal(f[index.to("foreign")].cpu(), a[index])
        assert torch.equal(f.t().contiguous().cpu(), a.t().contiguous())
        # in-place ops on strided views write through to the base, as on the host
        host, dev = torch.zeros(4, 3), torch.zeros(4, 3, device="foreign")
        host[1:3, 0].fill_(7)
        dev[1:3, 0].fill_(7)
        host[:, 1].add_(torch.arange(4.0))
        dev[:, 1].add_(torch.arange(4.0, device="foreign"))
        assert torch.equal(dev.cpu(), host)
        assert torch.arange(5, device="foreign").device.type == "foreign"
        """,
    )


def test_the_devices_generators_are_its_own(foreign_site):
    check(
        foreign_site,
        """
        def draw(generator=None):
            return torch.empty(6, device="foreign").exponential_(generator=generator).cpu()

        seeded = [draw(torch.Generator("foreign").manual_seed(3)) for _ in range(2)]
        assert torch.Generator("foreign").device == torch.device("foreign", 0)
        assert torch.equal(seeded[0], seeded[1])
        assert not torch.equal(seeded[0], draw(torch.Generator("foreign").manual_seed(4)))
        # torch.manual_seed seeds the device too (torch.foreign.manual_seed_all) ...
        torch.manual_seed(5)
        first = draw()
        torch.manual_seed(5)
        assert torch.equal(draw(), first)
        # ... and the device's own seed leaves the host's generator alone
        torch.manual_seed(5)
        torch.foreign.manual_seed(6)
        assert not torch.equal(draw(), first)
        host = torch.rand(3)
        torch.manual_seed(5)
        assert torch.equal(torch.rand(3), host)
        """,
    )


def test_streams_and_events_exist(foreign_site):
    check(
        foreign_site,
        """
        stream = torch.Stream("foreign")
        assert stream.device == torch.device("foreign", 0)
        with stream:
            assert torch.accelerator.current_stream().stream_id == stream.stream_id
        timed = {"enable_timing": True}
        start, end = torch.Event("foreign", **timed), torch.Event("foreign", **timed)
        start.record()
        torch.ones(100, device="foreign").sum()
        end.record()
        end.synchronize()
        assert start.query() and start.elapsed_time(end) >= 0
        torch.accelerator.synchronize()
        """,
    )
