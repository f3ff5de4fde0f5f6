"""The TorchScript tutorial's first two examples, in dataflow.

Run it with ``dataflow run examples/fork_basics.py`` (or ``python examples/fork_basics.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

import dataflow
import ops


def foo(x: np.ndarray) -> ops.Tensor:
    y: ops.Tensor = ops.negative(x)  # a pending ops.Tensor, returned at once
    return y


async def example(x: np.ndarray) -> tuple[ops.Tensor, ops.Tensor]:
    # Fork a task: it runs `foo(x)` in parallel with what follows.
    future = dataflow.fork(foo, x)
    # Call `foo` normally.
    x_normal = foo(x)
    # Wait for the forked task: its value is the pending tensor `foo` returned.
    x_parallel = await dataflow.wait(future)
    return x_normal, x_parallel


async def example_loop(x: np.ndarray) -> ops.Tensor:
    # Launch 100 forks, wait for them all, then stack and sum: -100.
    futures = [dataflow.fork(foo, x) for _ in range(100)]
    results = [await dataflow.wait(f) for f in futures]
    total: ops.Tensor = ops.sum(ops.stack(results))
    return total


def main(argv: Sequence[str] | None = None) -> int:
    """Run both examples and print their results (the command line takes no arguments)."""
    argparse.ArgumentParser(
        prog="fork_basics.py",
        description=(
            "The TorchScript tutorial's first two fork examples in dataflow: one fork awaited "
            "beside a plain call, then 100 forks stacked and summed. Takes no arguments."
        ),
    ).parse_args(argv)
    print(dataflow.run(example, np.ones(1)))  # (array([-1.]), array([-1.]))
    print(dataflow.run(example_loop, np.ones(())))  # -100.0
    return 0


if __name__ == "__main__":
    sys.exit(main())
