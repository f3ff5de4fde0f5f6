"""The benchmark suite: its pure parts, the references it checks against, and a smoke run of
each benchmark (``python -m benchmarks --quick --only NAME``). No wall time is asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import BENCHMARKS
from benchmarks._dag import Dag, critical_path, dask_graph, lower_bound
from benchmarks._harness import (
    JSON_PREFIX,
    Comparison,
    Contender,
    format_table,
    interleave,
    json_line,
    median_ratio,
)
from benchmarks._reference import (
    ensemble_forward,
    lstm_forward,
    lstm_step,
    make_input,
    make_weights,
)

ROOT = Path(__file__).resolve().parent.parent
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_DASK = importlib.util.find_spec("dask") is not None


class TestHarness:
    def test_median_ratio_is_median_of_per_round_ratios(self) -> None:
        """The ratio is the median of the per-round ratios, not the ratio of medians."""
        ratio, ratios = median_ratio([2.0, 9.0, 3.0], [1.0, 3.0, 1.0])
        assert ratios == [2.0, 3.0, 3.0]
        assert ratio == 3.0

    def test_median_ratio_needs_matching_rounds(self) -> None:
        """Values and baseline must have one entry per round."""
        with pytest.raises(ValueError, match="as many values"):
            median_ratio([1.0], [1.0, 2.0])

    def test_interleave_rotates_and_skips(self) -> None:
        """Every contender is measured once per round, in rotated order; skipped ones never."""
        calls: list[str] = []

        def make(name: str, value: float) -> Contender:
            def measure() -> float:
                calls.append(name)
                return value

            return Contender(name, measure)

        skipped = Contender("c", lambda: pytest.fail("measured a skipped contender"), skip="no")
        rows = interleave([make("a", 2.0), make("b", 4.0), skipped], 3, baseline="a", warmup=1)
        assert calls == ["b", "a", "a", "b", "b", "a", "a", "b"]
        assert [r.values for r in rows] == [[2.0] * 3, [4.0] * 3, []]
        assert rows[1].ratio == 2.0
        assert rows[2].skip == "no" and rows[2].ratio is None

    def test_interleave_stops_on_error(self) -> None:
        """A contender that raises stops the comparison (no silent drop-outs)."""

        def broken() -> float:
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            interleave([Contender("x", broken)], 2, baseline="x")

    def test_table_and_json_line(self) -> None:
        """The table names every contender; the JSON line parses and carries the values."""
        rows = interleave(
            [Contender("base", lambda: 1.0), Contender("other", lambda: 0.5, note="2 threads")],
            2,
            baseline="base",
        )
        rows[1].extra["roofline"] = 0.25
        cmp = Comparison("demo", "demo table", "s", "base", rows, columns=("roofline",))
        table = format_table(cmp)
        assert "| other" in table and "vs base" in table and "0.500" in table
        line = json_line("demo", [cmp])
        assert line.startswith(JSON_PREFIX)
        payload = json.loads(line[len(JSON_PREFIX) :])
        row = payload["comparisons"][0]["rows"][1]
        assert row["median"] == 0.5 and row["ratio_to_baseline"] == 0.5
        assert row["roofline"] == 0.25


class TestDag:
    def _diamond(self) -> Dag:
        dag = Dag()
        dag.add(1, (), None)
        dag.add(2, (1,), None)
        dag.add(3, (1,), None)
        dag.add(4, (2, 3), None)
        return dag

    def test_critical_path(self) -> None:
        """The critical path is the heaviest chain."""
        dur = {1: 1.0, 2: 5.0, 3: 2.0, 4: 1.0}
        assert critical_path(self._diamond(), dur) == 7.0

    def test_lower_bound_is_max_of_path_and_work(self) -> None:
        """One thread: all the work; many threads: the critical path."""
        dur = {1: 1.0, 2: 5.0, 3: 2.0, 4: 1.0}
        assert lower_bound(self._diamond(), dur, 1) == 9.0
        assert lower_bound(self._diamond(), dur, 16) == 7.0

    def test_dask_graph_has_every_task_and_the_sink(self) -> None:
        """The dask graph has one task per node, reading its inputs' keys."""

        def kernel(tid: int, seconds: float, *deps: object) -> None:
            return None

        graph, sinks = dask_graph(self._diamond(), {4: 0.5}, kernel)
        assert sinks == ["t4"]
        assert graph["t4"] == (kernel, 4, 0.5, "t2", "t3")
        assert set(graph) == {"t1", "t2", "t3", "t4"}


class TestReference:
    def test_first_step_from_zero_state(self) -> None:
        """A step without a previous state equals a step from zeros."""
        w = make_weights(8, n_models=1).models[0].forward
        gx = np.random.default_rng(0).random((3, 32), dtype=np.float32)
        zeros = np.zeros((3, 8), np.float32)
        h1, c1 = lstm_step(gx, None, None, w.w_hh)
        h2, c2 = lstm_step(gx, zeros, zeros, w.w_hh)
        np.testing.assert_allclose(h1, h2, rtol=1e-6)
        np.testing.assert_allclose(c1, c2, rtol=1e-6)

    def test_lstm_matches_naive_loop(self) -> None:
        """The GEMM-over-all-steps LSTM equals a textbook per-step LSTM in float64."""
        w = make_weights(6, n_models=1).models[0].forward
        x = make_input(4, 2, 6)
        h = np.zeros((2, 6))
        c = np.zeros((2, 6))
        outs = []

        def sig(v: np.ndarray) -> np.ndarray:
            return 1 / (1 + np.exp(-v))  # type: ignore[no-any-return]

        for t in range(4):
            g = x[t] @ w.w_ih.T.astype(np.float64) + h @ w.w_hh.T + w.b_ih + w.b_hh
            i, f, gg, o = np.split(g, 4, axis=1)
            c = sig(f) * c + sig(i) * np.tanh(gg)
            h = sig(o) * np.tanh(c)
            outs.append(h)
        np.testing.assert_allclose(lstm_forward(x, w), np.stack(outs), rtol=1e-5, atol=1e-6)

    @pytest.mark.skipif(not HAS_DASK, reason="dask not installed")
    def test_dask_graph_matches_reference(self) -> None:
        """The dask contender's graph computes the reference's output."""
        import dask.threaded

        from benchmarks._dask_ensemble import OUTPUT_KEY, ensemble_graph

        w = make_weights(8)
        x = make_input(5, 3, 8)
        out = dask.threaded.get(ensemble_graph(x, w), OUTPUT_KEY, num_workers=2)
        np.testing.assert_allclose(out, ensemble_forward(x, w), rtol=1e-5, atol=1e-6)

    @pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
    @pytest.mark.parametrize("variant", ["eager", "script", "fork directions", "fork members"])
    def test_torch_models_match_reference(self, variant: str) -> None:
        """Every torch contender, with the reference's weights, computes the same output."""
        import torch

        from benchmarks._torch_models import build

        w = make_weights(8)
        x = make_input(5, 3, 8)
        model = build(
            w,
            fork_directions=variant.startswith("fork"),
            fork_members=variant == "fork members",
            script=variant != "eager",
        )
        with torch.no_grad():
            out = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(out, ensemble_forward(x, w), rtol=1e-4, atol=1e-5)


def _run(*args: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args, "--out", str(out), "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )


class TestCommand:
    @pytest.mark.parametrize("name", list(BENCHMARKS))
    def test_quick_run_prints_json(self, name: str, tmp_path: Path) -> None:
        """`python -m benchmarks --quick --only NAME` exits 0 and prints its JSON line."""
        proc = _run("--quick", "--only", name, out=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(JSON_PREFIX)]
        assert len(lines) == 1, proc.stdout[-3000:]
        payload = json.loads(lines[0][len(JSON_PREFIX) :])
        assert payload["benchmark"] == name
        saved = json.loads((tmp_path / "latest.json").read_text())
        assert name in saved["benchmarks"] and saved["machine"]["cores_available"] >= 1

    def test_unknown_benchmark_is_an_error(self, tmp_path: Path) -> None:
        """An unknown --only name exits 2 and lists the valid names."""
        proc = _run("--only", "nope", out=tmp_path)
        assert proc.returncode == 2
        assert "unknown benchmark 'nope'" in proc.stderr and "overhead" in proc.stderr


class TestChosenContenders:
    """``--size`` and ``--contender`` narrow the ensemble benchmark (the baseline stays)."""

    def test_chosen(self) -> None:
        from benchmarks.ensemble import chosen

        factories = {"numpy sequential": 1, "dataflow, automatic": 2, "torch eager": 3}
        assert chosen(factories, ()) == factories
        assert chosen(factories, ("torch eager",)) == {"numpy sequential": 1, "torch eager": 3}
        with pytest.raises(ValueError, match=r"no contender named 'nope'.*'torch eager'"):
            chosen(factories, ("nope",))

    def test_a_bad_size_is_a_usage_error(self, tmp_path: Path) -> None:
        proc = _run("--only", "ensemble", "--size", "50,50", out=tmp_path)
        assert proc.returncode == 2
        assert "a size is T,B,C" in proc.stderr

    def test_one_size_and_one_contender(self, tmp_path: Path) -> None:
        proc = _run(
            "--only", "ensemble", "--size", "4,2,8", "--contender", "dataflow, defaults",
            "--rounds", "1", out=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        saved = json.loads((tmp_path / "latest.json").read_text())
        (table,) = saved["benchmarks"]["ensemble"]["comparisons"]
        assert table["params"]["size"] == [4, 2, 8]
        assert [r["name"] for r in table["rows"]] == ["numpy sequential", "dataflow, defaults"]


class TestFreshProcessContenders:
    """benchmarks/ensemble.py runs each contender's round in a fresh child process."""

    def _child(self, name: str, expected: np.ndarray, tmp_path: Path) -> Any:
        from benchmarks.ensemble import _child_contender

        path = tmp_path / "expected.npy"
        np.save(path, expected)
        return _child_contender(name, "note", (4, 2, 8), 2, path)

    def test_a_child_round_reports_its_seconds(self, tmp_path: Path) -> None:
        """The child warms up, times its round, checks the output and reports seconds."""
        x, w = make_input(4, 2, 8), make_weights(8)
        contender = self._child("dataflow, automatic", ensemble_forward(x, w), tmp_path)
        seconds = contender.measure()
        assert 0 < seconds < 60

    def test_a_wrong_output_stops_the_run_naming_the_contender(self, tmp_path: Path) -> None:
        """A child whose output differs from the reference fails, and the parent says which."""
        from benchmarks.ensemble import MismatchError

        x, w = make_input(4, 2, 8), make_weights(8)
        contender = self._child("numpy sequential", ensemble_forward(x, w) + 1.0, tmp_path)
        with pytest.raises(MismatchError, match=r"'numpy sequential' failed in its child"):
            contender.measure()

    def test_roofline_uses_the_thread_setting(self) -> None:
        """A parallel contender's roofline is n cores x the one-thread rates; a sequential
        one's the all-core rates (or the one-thread ones where those were faster)."""
        from benchmarks._machine import cores
        from benchmarks.ensemble import roofline_seconds

        rates = {"proj1": 10e9, "projN": 15e9, "step1": 5e9, "stepN": 4e9}
        size = (2, 3, 4)
        flops = 2.0 * 2 * 3 * 4 * 16 * 2  # one model's projections (and as much in steps)
        par = roofline_seconds(size, 1, rates, parallel=True)
        seq = roofline_seconds(size, 1, rates, parallel=False)
        assert par == pytest.approx((flops / 10e9 + flops / 5e9) / cores())
        assert seq == pytest.approx(flops / 15e9 + flops / 5e9)


class TestAwaited:
    """benchmarks/awaited.py: one LSTM awaited at every call, each round in a child."""

    def test_a_child_round_reports_its_seconds(self) -> None:
        from benchmarks.awaited import _child_contender

        seconds = _child_contender("dataflow, automatic", (4, 1, 8), 3).measure()
        assert 0 < seconds < 60

    def test_an_unknown_contender_fails_naming_it(self) -> None:
        from benchmarks.awaited import MismatchError, _child_contender

        with pytest.raises(MismatchError, match=r"'nope' failed in its child"):
            _child_contender("nope", (4, 1, 8), 3).measure()


class TestOverheadChildren:
    """benchmarks/overhead.py runs every round of every contender in a fresh process."""

    def _spec(self) -> dict[str, Any]:
        counts = {m: {"big": 200, "mid": 100, "small": 20} for m in ("batched", "one at a time")}
        return {"group": "tasks", "mode": "batched", "counts": counts, "n_tiny": 200}

    def test_a_child_round_reports_its_value_and_cpu(self) -> None:
        from benchmarks._harness import Contender
        from benchmarks.overhead import _fresh

        cpu: list[float] = []
        c = Contender("dataflow op, inline", lambda: 0.0, extra={"cpu": cpu})
        value = _fresh(c, self._spec()).measure()
        assert 0 < value < 1e4 and len(cpu) == 1 and cpu[0] > 0

    def test_offloaded_in_waves_runs_every_task(self) -> None:
        """The "1,000 in flight" row runs all of its tasks, in waves (the last one partial),
        and is one of the batched table's contenders."""
        import asyncio

        from benchmarks import overhead

        seen: list[int] = []

        class Op:
            def __call__(self, i: int) -> Any:
                seen.append(i)
                return asyncio.sleep(0)

        asyncio.run(overhead._op_waves(Op(), overhead.IN_FLIGHT + 5))  # type: ignore[arg-type]
        assert seen == list(range(overhead.IN_FLIGHT + 5))
        assert overhead.OFFLOADED_IN_FLIGHT in {
            c.name
            for c in overhead._contenders("batched", self._spec()["counts"]["batched"], None)  # type: ignore[arg-type]
        }

    def test_an_unknown_contender_fails_naming_it(self) -> None:
        from benchmarks._harness import Contender
        from benchmarks.overhead import ChildError, _fresh

        with pytest.raises(ChildError, match=r"'nope' failed in its child"):
            _fresh(Contender("nope", lambda: 0.0), self._spec()).measure()


class TestSettle:
    """benchmarks/bench_settle.py: the settling and settled lines per size and thread count."""

    def test_quick_run_prints_both_lines(self, capsys: pytest.CaptureFixture[str]) -> None:
        from benchmarks import bench_settle

        assert bench_settle.main(["--quick"]) == 0
        out = capsys.readouterr().out
        assert "(4, 1, 8) inter-op  2" in out
        assert "settling, per 10 forwards" in out and "/p" in out
        assert "settled, best / numpy best: automatic " in out and "compiled " in out

    def test_each_row_runs_in_a_fresh_process(self, capfd: pytest.CaptureFixture[str]) -> None:
        # What a runtime learns belongs to the op's signatures and outlives the runtime: a
        # row run after another of its size in one process would hide its learning phase.
        from benchmarks import bench_settle

        argv = ["--sizes", "4x1x8", "--threads", "1,2", "--forwards", "10", "--rounds", "1"]
        assert bench_settle.main([*argv, "--no-compiled"]) == 0
        out = capfd.readouterr().out
        assert "(4, 1, 8) inter-op  1" in out and "(4, 1, 8) inter-op  2" in out
        assert out.count("settling, per 10 forwards") == 2
        assert "the child failed" not in out

    def test_bad_arguments_are_refused(self) -> None:
        from benchmarks import bench_settle

        with pytest.raises(SystemExit):
            bench_settle.main(["--rounds", "0"])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
class TestPrivatePeak:
    """benchmarks/memory.py's private-memory sampler (the ``private_mib`` column)."""

    def test_sees_memory_allocated_and_freed_inside_the_block(self) -> None:
        from benchmarks.memory import PrivatePeak, _status_kib

        before = _status_kib("RssAnon")
        assert before is not None
        with PrivatePeak(interval=0.0002) as private:
            block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, every page touched
            deadline = time.perf_counter() + 0.05
            while time.perf_counter() < deadline:  # held for many sampling intervals
                time.sleep(0.001)
            del block
        assert private.peak is not None
        assert private.peak - before >= 48 << 10  # KiB
        assert not private._thread.is_alive()

    def test_the_sampler_thread_ends_when_the_block_raises(self) -> None:
        from benchmarks.memory import PrivatePeak

        with pytest.raises(KeyError), PrivatePeak() as private:
            raise KeyError("boom")
        assert not private._thread.is_alive() and private.peak is not None
