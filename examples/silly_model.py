"""Compile a model with two attention-like split points at level 3 and check it.

    python examples/silly_model.py                 # the platform's compiler (Inductor on CPU)
    python examples/silly_model.py -O.backend=eager --json

The graph splits into 5 pieces, 3 of them compiled; the result must equal the
uncompiled model for every batch size, including sizes 0 and 1.
"""

from __future__ import annotations

import argparse
import json
import logging

import torch

from slotwise.compilation import CompilationConfig, counters
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    CompilationConfig.add_cli_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    config = CompilationConfig.from_cli_namespace(args).replace(
        splitting_ops=TOY_SPLITTING_OPS, compile_sizes=[4]
    )
    torch.manual_seed(0)
    compiled = SillyModel(compilation_config=config)
    torch.manual_seed(0)
    reference = SillyModel(compilation_config=CompilationConfig(level=0))

    max_error = 0.0
    for batch in (0, 1, 3, 4, 16):
        x = torch.randn(batch, 8)
        difference = (compiled(x) - reference(x)).abs()
        if difference.numel():
            max_error = max(max_error, difference.max().item())
    result = {
        "config": config.to_dict(),
        "counters": counters.snapshot(),
        "max_abs_error": max_error,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, value in result["counters"].items():
            print(f"{name:40s} {value}")
        print(f"{'max_abs_error':40s} {max_error:.2e}")
    ok = max_error < 1e-4 and counters.num_piecewise_graphs_seen == 5
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
