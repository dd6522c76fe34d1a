"""`slotwise matrix`: every installed platform's features, available here or not."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from support import clean_env

from slotwise.version import API_VERSION

BUNDLED = ("ascend_stub", "cuda", "cpu")  # by priority, as the matrix orders them
#: What each bundled plugin's spec declares: the minor version that added what it uses.
REQUIRED_API = {"ascend_stub": ">=1.1,<2", "cuda": ">=1.4,<2", "cpu": ">=1.5,<2"}


def slotwise(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slotwise", *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )


def matrix_in(dists, *args: str) -> subprocess.CompletedProcess[str]:
    """`slotwise matrix ARGS` in a process that also sees the throwaway distributions."""
    return dists.run(f"from slotwise.cli.main import main\nraise SystemExit(main({args!r}))")


def vendor_plugin(
    name: str,
    *,
    graph_support: str = "ALWAYS",
    platform_cls: str = "VendorPlatform",
    graph_api: str = "return GraphApi()",
    broken_backend: bool = False,
) -> str:
    """A plugin whose static-graph platform ``name`` is never available on this machine."""
    extra_backend = 'registry.register(NAME, "no_such_module:Backend")' if broken_backend else ""
    return f"""
        import torch
        from slotwise.attention.backend import AttentionBackend, GraphSupport
        from slotwise.platforms import Platform, PlatformSpec
        from slotwise.plugins import hookimpl

        NAME = {name!r}

        class GraphApi:
            pass

        class VendorPlatform(Platform):
            name = NAME
            device_type = "cpu"
            dist_backend = "vendorccl"
            custom_op_key = "oot"

            def get_graph_api(self, **kwargs):
                {graph_api}

            def get_communicator_cls(self, **kwargs):
                self._not_implemented("get_communicator_cls")

        class VendorBackend(AttentionBackend):
            supported_dtypes = (torch.float16,)
            graph_support = GraphSupport.{graph_support}

            @classmethod
            def get_name(cls):
                return "VENDOR_ATTN"

        def rms_norm(layer, x, residual=None):
            return x

        @hookimpl
        def slotwise_platforms():
            return [PlatformSpec(NAME, __name__ + ":{platform_cls}", lambda: "no vendor card",
                                 priority=200)]

        @hookimpl
        def slotwise_register_attention_backends(registry):
            registry.register(NAME, __name__ + ":VendorBackend")
            {extra_backend}

        @hookimpl
        def slotwise_register_custom_ops(registry):
            registry.register(NAME, "rms_norm", __name__ + ":rms_norm")
    """


def table_rows(text: str) -> dict[str, list[str]]:
    """The plain table as {feature: cells}, the header under "feature"."""
    lines = text.split("\n\n")[1].splitlines()
    return {cells[0]: cells[1:] for cells in (re.split(r" {2,}", line) for line in lines)}


def test_table_shows_every_bundled_platform_and_why_some_are_unavailable():
    result = slotwise("matrix")
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)
    assert rows["feature"] == list(BUNDLED)
    assert rows["status"] == ["unavailable", "unavailable", "selected"]
    assert rows["graph modes"][BUNDLED.index("cpu")] == "NONE"
    assert rows["graph modes"][BUNDLED.index("cuda")].startswith("NONE, PIECEWISE")
    assert rows["default graph mode"] == ["FULL_AND_PIECEWISE", "FULL_AND_PIECEWISE", "NONE"]
    assert "cpu default graph mode NONE: platform cpu has no static graphs" in result.stdout
    assert (
        "cuda default graph mode FULL_AND_PIECEWISE: platform cuda has static graphs and "
        "attention backend TRITON_PAGED (ALWAYS) may be captured in full graphs of "
        "uniform-decode batches"
    ) in result.stdout
    assert "rms_norm" in rows["custom-op replacements"][BUNDLED.index("cuda")]
    assert rows["custom-op key"] == ["forward_oot", "forward_cuda", "forward_cpu"]
    assert "cuda is unavailable: " in result.stdout
    assert "SLOTWISE_ASCEND_STUB_DEVICES is not set" in result.stdout


def test_json_describes_each_platform_without_errors():
    result = slotwise("matrix", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["api_version"] == API_VERSION and info["selected"] == "cpu"
    platforms = {p["name"]: p for p in info["platforms"]}
    assert list(platforms) == list(BUNDLED)
    for platform in platforms.values():
        assert platform["errors"] == {}
        assert platform["requires_api"] == REQUIRED_API[platform["name"]]
        assert "float32" in platform["dtypes"]
        assert platform["attention_backends"][0]["name"]
    assert platforms["cpu"]["communicator"]["backend"] == "gloo"
    assert platforms["cuda"]["communicator"]["backend"] == "nccl"
    assert platforms["cuda"]["custom_ops"] == ["rms_norm", "rotary_embedding", "silu_and_mul"]
    stub = platforms["ascend_stub"]["default_graph_mode"]
    assert stub["mode"] == "FULL_AND_PIECEWISE"
    assert "ASCEND_STUB_REFERENCE (UNIFORM_DECODE) may be captured" in stub["reason"]
    assert platforms["cpu"]["default_graph_mode"]["mode"] == "NONE"


def test_markdown_is_a_well_formed_table():
    result = slotwise("matrix", "--markdown")
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("\n\n")[0].splitlines()
    assert table[0] == "| feature | " + " | ".join(BUNDLED) + " |"
    assert table[1] == "| --- | --- | --- | --- |"
    assert any(line.startswith("| **graph modes** | ") for line in table)
    for line in table:
        assert len(re.findall(r"(?<!\\)\|", line)) == len(BUNDLED) + 2, line


ALL_MODES = ["NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE"]


@pytest.mark.parametrize(
    "graph_support, graph_api, modes, default",
    [
        ("ALWAYS", "return GraphApi()", ALL_MODES, ("FULL_AND_PIECEWISE", "VENDOR_ATTN (ALWAYS)")),
        (
            "UNIFORM_DECODE",
            "return GraphApi()",
            ["NONE", "PIECEWISE", "FULL_AND_PIECEWISE"],
            ("FULL_AND_PIECEWISE", "VENDOR_ATTN (UNIFORM_DECODE) may be captured"),
        ),
        (
            "PIECEWISE_ONLY",
            "return GraphApi()",
            ["NONE", "PIECEWISE"],
            ("PIECEWISE", "VENDOR_ATTN has graph_support PIECEWISE_ONLY"),
        ),
        # No GraphAPI: no static graphs at all.
        ("ALWAYS", "return None", ["NONE"], ("NONE", "platform vendor has no static graphs")),
    ],
)
def test_unavailable_vendor_platform_is_described_and_full_graphs_need_attention_support(
    dists, graph_support, graph_api, modes, default
):
    plugin = vendor_plugin("vendor", graph_support=graph_support, graph_api=graph_api)
    dists.add("slotwise-vendor", plugin)
    result = matrix_in(dists, "matrix", "--json")
    assert result.returncode == 0, result.stderr
    vendor = next(p for p in json.loads(result.stdout)["platforms"] if p["name"] == "vendor")
    assert vendor["status"] == "unavailable" and vendor["reason"] == "no vendor card"
    assert vendor["graph_modes"] == modes
    mode, reason = default
    assert vendor["default_graph_mode"]["mode"] == mode
    assert reason in vendor["default_graph_mode"]["reason"]
    assert vendor["dtypes"] == ["float16"]
    assert vendor["communicator"] == {"backend": "vendorccl", "class": None}
    assert vendor["custom_ops"] == ["rms_norm"]
    assert vendor["errors"] == {}
    rows = table_rows(matrix_in(dists, "matrix").stdout)
    assert rows["communicator"][rows["feature"].index("vendor")] == "vendorccl: not implemented"
    assert rows["default graph mode"][rows["feature"].index("vendor")] == mode


def test_broken_plugins_show_errors_in_their_cells_and_the_rest_still_prints(dists):
    dists.add("slotwise-noclass", vendor_plugin("noclass", platform_cls="Missing"))
    dists.add(
        "slotwise-nographs",
        vendor_plugin(
            "nographs", graph_api="raise RuntimeError('graphs exploded')", broken_backend=True
        ),
    )
    result = matrix_in(dists, "matrix")
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)
    noclass = rows["feature"].index("noclass")
    nographs = rows["feature"].index("nographs")
    cpu = rows["feature"].index("cpu")
    assert rows["graph modes"][noclass] == "error, see notes"
    assert rows["default graph mode"][noclass] == "error, see notes"
    assert rows["default graph mode"][nographs] == "error, see notes"
    assert rows["communicator"][noclass] == "error, see notes"
    assert rows["attention backends"][noclass] == "VENDOR_ATTN"
    assert rows["graph modes"][nographs] == "error, see notes"
    assert rows["attention backends"][nographs].startswith("VENDOR_ATTN, no_such_module:Backend")
    assert rows["graph modes"][cpu] == "NONE"
    assert "noclass platform: PlatformError" in result.stdout
    assert "cannot get 'Missing' from module 'slotwise_noclass'" in result.stdout
    assert "nographs graph modes: RuntimeError: graphs exploded" in result.stdout
    assert "nographs default graph mode: RuntimeError: graphs exploded" in result.stdout
    assert "nographs attention backend no_such_module:Backend: AttentionBackendError" in (
        result.stdout
    )
    assert "cannot import module 'no_such_module'" in result.stdout


def test_piecewise_modes_are_not_shown_when_the_piecewise_backend_is_broken(dists):
    plugin = vendor_plugin("vendor").replace(
        "        def get_communicator_cls(self, **kwargs):",
        "        def get_piecewise_backend_cls(self, **kwargs):\n"
        "                from vendor_sdk import PiecewiseBackend\n\n"
        "            def get_communicator_cls(self, **kwargs):",
    )
    dists.add("slotwise-vendor", plugin)
    result = matrix_in(dists, "matrix", "--json")
    assert result.returncode == 0, result.stderr
    vendor = next(p for p in json.loads(result.stdout)["platforms"] if p["name"] == "vendor")
    assert vendor["graph_modes"] == ["NONE", "FULL"]
    assert vendor["errors"]["piecewise_backend"].startswith(
        "ModuleNotFoundError: No module named 'vendor_sdk'"
    )
    table = matrix_in(dists, "matrix").stdout
    assert "vendor piecewise backend (piecewise graph modes left out): ModuleNotFoundError" in (
        table
    )


def test_json_stays_json_when_a_plugin_prints(dists):
    source = vendor_plugin("vendor", graph_api="print('vendor: graphs asked'); return GraphApi()")
    imported = "print('vendor: imported')\n\n        class GraphApi:"
    source = source.replace("class GraphApi:", imported)
    dists.add("slotwise-vendor", source)
    result = matrix_in(dists, "matrix", "--json")
    assert result.returncode == 0, result.stderr
    vendor = next(p for p in json.loads(result.stdout)["platforms"] if p["name"] == "vendor")
    assert vendor["errors"] == {}
    assert "vendor: imported" in result.stderr and "vendor: graphs asked" in result.stderr
