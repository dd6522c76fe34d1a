"""Copies of the `slotwise new-plugin` scaffold, each broken as real kernels ship, fail.

The scaffold is generated and installed once; each test copies the installed package,
breaks one file the way a vendor's kernel goes wrong in precision or dtype, and runs
`slotwise conformance` on the copy (the checks that tell, selected with -k):

- an attention that keeps its online-softmax running sums and output in bfloat16
  fails on a long context, and only in bfloat16 and float16;
- an attention that hands back its float32 buffer fails the dtype check for half inputs;
- an RMSNorm ignoring eps fails on small-magnitude inputs, in every dtype;
- an RMSNorm returning float32 for half inputs fails in bfloat16 and float16 only.

The unbroken scaffold passes, and with one device the verdict names the communicator
as not run, which ``--require-all`` turns into a failure.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conformance_runs import environment, run_cli
from support import pip_install_into

pytestmark = pytest.mark.slow

NAME = "acme"
PACKAGE = "slotwise_acme"


@pytest.fixture(scope="module")
def scaffold_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scaffold, generated and pip-installed into a folder of its own."""
    root = tmp_path_factory.mktemp("scaffold")
    folder = root / "plugin"
    subprocess.run(
        [sys.executable, "-m", "slotwise", "new-plugin", NAME, "--path", str(folder)],
        env=environment(),
        check=True,
        capture_output=True,
    )
    site = root / "site"
    pip_install_into(site, folder)
    return site


def broken_copy(scaffold_site: Path, tmp_path: Path, module: str, old: str, new: str) -> Path:
    """A copy of the installed scaffold with ``old`` replaced by ``new`` in ``module``."""
    site = tmp_path / "site"
    shutil.copytree(scaffold_site, site)
    path = site / PACKAGE / module
    source = path.read_text()
    old, new = textwrap.dedent(old).strip("\n"), textwrap.dedent(new).strip("\n")
    indent = " " * (12 if module == "attention.py" else 8)  # the patched code's depth
    old, new = textwrap.indent(old, indent), textwrap.indent(new, indent)
    assert old in source, f"the scaffold's {module} changed: update this test's patch"
    path.write_text(source.replace(old, new))
    return site


def failed_tests(summary: dict, check: str) -> dict[str, str]:
    """The failed tests of ``check``, by name, with their messages."""
    tests = next(c["tests"] for c in summary["checks"] if c["check"] == check)
    return {t["name"]: t["message"] for t in tests if t["outcome"] == "failed"}


def test_the_scaffold_passes_and_its_verdict_names_the_check_not_run(scaffold_site):
    summary, result = run_cli(NAME, site=scaffold_site, ACME_DEVICES="1")
    assert result.returncode == 0, result.stderr[-5000:]
    assert summary["verdict"].startswith("PASSED, 1 check not run: communicator (needs 2 ")
    assert "ACME_DEVICES" in summary["verdict"]
    assert [t["check"] for t in summary["not_run"]] == ["communicator"]

    summary, result = run_cli(
        NAME, "-k", "communicator", site=scaffold_site, ACME_DEVICES="1", require_all=True
    )
    assert result.returncode == 1, result.stderr[-5000:]
    assert summary["passed"] is False
    assert summary["verdict"].startswith("FAILED, 1 check not run: communicator")
    assert "--require-all" in summary["verdict"]


#: The scaffold's softmax and product with V, over the whole sequence in float32 ...
WHOLE_SEQUENCE = """
    probs = scores.softmax(dim=-1)
    output[start:end] = torch.einsum("hij,jhd->ihd", probs, values.float()).to(output.dtype)
"""
#: ... as a paged kernel's online softmax, block by block, its running maximum, sum and
#: output kept in the inputs' dtype.
ONLINE_SOFTMAX_IN_THE_INPUT_DTYPE = """
    dtype = q.dtype
    scores = scores.to(dtype)
    running_max = torch.full(scores.shape[:2] + (1,), float("-inf"), dtype=dtype)
    running_sum = torch.zeros(scores.shape[:2] + (1,), dtype=dtype)
    acc = torch.zeros(scores.shape[:2] + (values.shape[-1],), dtype=dtype)
    for block in range(0, seq_len, block_size):
        part = scores[:, :, block : block + block_size]
        new_max = torch.maximum(running_max, part.amax(dim=-1, keepdim=True))
        rescale = (running_max - new_max).exp()
        weights = (part - new_max).exp()
        running_sum = running_sum * rescale + weights.sum(dim=-1, keepdim=True)
        block_values = values[block : block + block_size].transpose(0, 1)  # [heads, n, D]
        acc = acc * rescale + weights @ block_values
        running_max = new_max
    output[start:end] = (acc / running_sum).transpose(0, 1).to(output.dtype)
"""


def test_an_attention_accumulating_in_bfloat16_fails_on_a_long_context(scaffold_site, tmp_path):
    site = broken_copy(
        scaffold_site, tmp_path, "attention.py", WHOLE_SEQUENCE, ONLINE_SOFTMAX_IN_THE_INPUT_DTYPE
    )
    summary, result = run_cli(NAME, "-k", "long_context", site=site, ACME_DEVICES="1")
    assert result.returncode == 1, result.stderr[-5000:]
    failed = failed_tests(summary, "attention")
    names = "test_attention_on_a_long_context[{}]".format
    assert set(failed) == {names("bfloat16"), names("float16")}, summary
    for message in failed.values():
        assert re.search(r"float32 accumulation over 409[56] keys", message), message
        assert "times the error allowed there" in message, message


#: The scaffold's write of each request's result into the output ...
WRITE_INTO_THE_OUTPUT = WHOLE_SEQUENCE
#: ... into a float32 buffer of its own instead, handed back as the output's data.
HAND_BACK_A_FLOAT32_BUFFER = """
    probs = scores.softmax(dim=-1)
    if r == 0:
        result = torch.zeros(output.shape, dtype=torch.float32, device=output.device)
    result[start:end] = torch.einsum("hij,jhd->ihd", probs, values.float())
    if r == metadata.num_reqs - 1:
        output.data = result
"""


def test_an_attention_returning_float32_for_half_inputs_fails_the_dtype_check(
    scaffold_site, tmp_path
):
    site = broken_copy(
        scaffold_site, tmp_path, "attention.py", WRITE_INTO_THE_OUTPUT, HAND_BACK_A_FLOAT32_BUFFER
    )
    summary, result = run_cli(
        NAME, "-k", "matches_the_reference and mixed", site=site, ACME_DEVICES="1"
    )
    assert result.returncode == 1, result.stderr[-5000:]
    failed = failed_tests(summary, "attention")
    name = "test_attention_matches_the_reference[mixed-{}-128-2-1.25]".format
    assert set(failed) == {name("bfloat16"), name("float16")}, summary
    for dtype in ("bfloat16", "float16"):
        message = failed[name(dtype)]
        assert f"has dtype torch.float32, expected torch.{dtype}" in message, message


#: The scaffold's RMSNorm kernel stand-in.
NORM = """
    normed = x.float() * (mean_square + layer.eps).rsqrt() * layer.weight.float()
    return normed.to(x.dtype)
"""
NORM_WITHOUT_EPS = """
    normed = x.float() * mean_square.rsqrt() * layer.weight.float()
    return normed.to(x.dtype)
"""
NORM_LEFT_IN_FLOAT32 = """
    normed = x.float() * (mean_square + layer.eps).rsqrt() * layer.weight.float()
    return normed
"""


def custom_op_failures(site: Path) -> dict[str, str]:
    summary, result = run_cli(NAME, "-k", "matches_forward_native", site=site, ACME_DEVICES="1")
    assert result.returncode == 1, result.stderr[-5000:]
    return failed_tests(summary, "custom_ops")


def test_an_rms_norm_ignoring_eps_fails_on_small_inputs_in_every_dtype(scaffold_site, tmp_path):
    site = broken_copy(scaffold_site, tmp_path, "custom_ops.py", NORM, NORM_WITHOUT_EPS)
    failed = custom_op_failures(site)
    dtypes = ("float32", "bfloat16", "float16")
    assert set(failed) == {f"test_custom_op_matches_forward_native[rms_norm-{d}]" for d in dtypes}
    for message in failed.values():
        assert "differs from forward_native computed in float64" in message, message
    # In half precision only the small inputs tell (float32 sees eps's 5e-7 on any input).
    for dtype in ("bfloat16", "float16"):
        message = failed[f"test_custom_op_matches_forward_native[rms_norm-{dtype}]"]
        assert "on x of magnitude 0.0001" in message, message


def test_an_rms_norm_left_in_float32_fails_in_half_precision_only(scaffold_site, tmp_path):
    site = broken_copy(scaffold_site, tmp_path, "custom_ops.py", NORM, NORM_LEFT_IN_FLOAT32)
    failed = custom_op_failures(site)
    assert set(failed) == {
        f"test_custom_op_matches_forward_native[rms_norm-{d}]" for d in ("bfloat16", "float16")
    }
    for dtype in ("bfloat16", "float16"):
        message = failed[f"test_custom_op_matches_forward_native[rms_norm-{dtype}]"]
        assert f"has dtype torch.float32, expected torch.{dtype}" in message, message
