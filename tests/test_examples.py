"""The examples: the LSTM ensemble script runs, and the aiohttp server answers correctly."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
import pytest

import dataflow
import ops

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

Array = np.ndarray[Any, Any]
TOL = 1e-4  # on sums of a few thousand float32 values


@pytest.fixture(scope="module")
def examples() -> Iterator[tuple[ModuleType, ModuleType]]:
    """examples.lstm_ensemble and examples.serve, imported from the repository root."""
    pytest.importorskip("aiohttp")
    added = str(ROOT) not in sys.path
    if added:
        sys.path.insert(0, str(ROOT))
    try:
        ensemble = importlib.import_module("examples.lstm_ensemble")
        serve = importlib.import_module("examples.serve")
        yield ensemble, serve
    finally:
        if added:
            sys.path.remove(str(ROOT))


def _sigmoid(a: Array) -> Array:
    out: Array = np.exp(-np.logaddexp(0.0, -a))
    return out


def ref_lstm(p: dict[str, Array], x: Array) -> Array:
    """torch.nn.LSTM's forward (one layer, zero state) as a numpy loop, in float64."""
    w_ih, w_hh = p["weight_ih_l0"].astype(np.float64), p["weight_hh_l0"].astype(np.float64)
    b = p["bias_ih_l0"].astype(np.float64) + p["bias_hh_l0"]
    h = np.zeros((x.shape[1], w_hh.shape[1]))
    c = np.zeros_like(h)
    out = []
    for t in range(x.shape[0]):
        i, f, g, o = np.split(x[t] @ w_ih.T + h @ w_hh.T + b, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        out.append(h)
    return np.stack(out)


def ref_ensemble(ens: Any, x: Array) -> Array:
    """The tutorial's ensemble computed with plain numpy from the model's weights."""
    total: Array = np.zeros((x.shape[0], x.shape[1], 2 * x.shape[2]))
    for m in ens.models:
        out_f = ref_lstm(m.cell_f.state_dict(), x)
        out_b = ref_lstm(m.cell_b.state_dict(), x[::-1])[::-1]
        total += np.concatenate([out_f, out_b], axis=2)
    return total


class RuntimeRecorder(dataflow.Instrument):
    """Counts started tasks and notes which runtimes they belong to."""

    def __init__(self) -> None:
        self.runtimes: set[int] = set()
        self.count = 0
        self._lock = threading.Lock()

    def task_started(self, ts: int, task: Any) -> None:
        with self._lock:
            self.runtimes.add(id(task.runtime))
            self.count += 1


def _check_summary(summary: dict[str, Any], expected: Array) -> None:
    assert summary["shape"] == list(expected.shape)
    assert summary["dtype"] == "float32"
    assert abs(summary["sum"] - float(expected.sum())) <= TOL * max(1.0, expected.size)
    assert abs(summary["mean"] - float(expected.mean())) <= TOL
    assert abs(summary["max"] - float(expected.max())) <= TOL
    assert np.allclose(summary["first"], expected.reshape(-1)[:4], atol=TOL)


async def _forward_once(model: Any, config: dict[str, int]) -> None:
    """One eager forward (so that a recorder has something to dump)."""
    x = np.ones((config["steps"], config["batch"], config["channels"]), dtype=np.float32)
    await model(x)


class TestLSTMEnsembleScript:
    """examples/lstm_ensemble.py runs from the shell and its model is importable."""

    def test_runs_small(self, tmp_path: Path) -> None:
        """`--small` runs the three ways, reports equal outputs and writes a trace."""
        cli = ROOT / "dataflow" / "_cli.py"
        script = str(EXAMPLES / "lstm_ensemble.py")
        trace = tmp_path / "parallel.json"
        args = ["--small", "--rounds", "2", "--trace", str(trace)]
        if cli.exists():
            cmd = [sys.executable, "-m", "dataflow", "run", script, *args]
        else:
            cmd = [sys.executable, script, *args]
        env = {**os.environ, "PYTHONWARNINGS": "error"}
        proc = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=100, env=env, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "sequential (1 thread)" in proc.stdout
        assert "manual forks (2 threads)" in proc.stdout
        assert "automatic (2 threads)" in proc.stdout
        assert "outputs equal (np.allclose): True" in proc.stdout
        assert trace.stat().st_size > 0

    def test_says_what_the_figures_are(self, tmp_path: Path) -> None:
        """Without a terminal: a progress line per round on stderr; stdout says medians."""
        script = str(EXAMPLES / "lstm_ensemble.py")
        proc = subprocess.run(
            [sys.executable, "-m", "dataflow", "run", script, "--small", "--rounds", "2"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rounds = [line for line in proc.stderr.splitlines() if line.startswith("round ")]
        assert [line.split(":")[0] for line in rounds] == ["round 1/2", "round 2/2"]
        assert all(
            ("sequential" in line and "manual forks" in line and "automatic" in line)
            for line in rounds
        )
        assert "median time" in proc.stdout and "median speedup" in proc.stdout
        assert "times: medians of 2 rounds; speedups: medians of the per-round ratios" in (
            proc.stdout
        )

    def test_defaults(self, examples: tuple[ModuleType, ModuleType]) -> None:
        """Left out, the sizes are the tutorial's (or --small's); given, they are kept."""
        ensemble, _ = examples
        args = ensemble.parse_args([])
        assert (args.steps, args.batch, args.channels, args.rounds) == (50, 50, 1024, 3)
        args = ensemble.parse_args(["--small"])
        assert (args.steps, args.batch, args.channels, args.rounds) == (10, 4, 64, 5)
        args = ensemble.parse_args(["--small", "-T", "1", "-B", "2", "-C", "3", "--rounds", "1"])
        assert (args.steps, args.batch, args.channels, args.rounds) == (1, 2, 3, 1)

    @pytest.mark.parametrize(
        ("flag", "name"),
        [("-T", "steps"), ("-B", "batch"), ("-C", "channels"), ("--rounds", "rounds")],
    )
    @pytest.mark.parametrize("value", ["0", "-1"])
    def test_zero_is_refused_not_the_default(
        self,
        examples: tuple[ModuleType, ModuleType],
        capsys: pytest.CaptureFixture[str],
        flag: str,
        name: str,
        value: str,
    ) -> None:
        """An explicit 0 is a usage error like -1, not the full default size."""
        ensemble, _ = examples
        with pytest.raises(SystemExit) as exc:
            ensemble.parse_args([flag, value, "--quiet"])
        assert exc.value.code == 2
        assert f"error: --{name} must be at least 1" in capsys.readouterr().err

    def test_bad_intraop_threads_is_a_usage_error(
        self, examples: tuple[ModuleType, ModuleType], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--intraop-threads 0 is argparse's error, like --interop-threads 0."""
        ensemble, _ = examples
        with pytest.raises(SystemExit) as exc:
            ensemble.parse_args(["--intraop-threads", "0"])
        assert exc.value.code == 2
        assert "error: --intraop-threads must be at least 1" in capsys.readouterr().err

    def test_negative_seed_is_a_usage_error(
        self, examples: tuple[ModuleType, ModuleType], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--seed -5 is one usage line, not numpy's traceback from default_rng."""
        ensemble, _ = examples
        with pytest.raises(SystemExit) as exc:
            ensemble.parse_args(["--seed", "-5"])
        assert exc.value.code == 2
        assert "error: --seed must be 0 or more, got -5" in capsys.readouterr().err

    def test_trace_path_is_checked_before_the_run(
        self,
        examples: tuple[ModuleType, ModuleType],
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
    ) -> None:
        """A --trace path that cannot be written is a usage error up front, not after the run."""
        ensemble, _ = examples
        missing = tmp_path / "no-such-dir" / "t.json"
        for path, says in ((missing, "no directory"), (tmp_path, "is a directory"), ("", "empty")):
            with pytest.raises(SystemExit) as exc:
                ensemble.main(["--small", "--quiet", "--trace", str(path)])
            assert exc.value.code == 2
            out = capsys.readouterr()
            assert "--trace: " in out.err and says in out.err
            assert "Traceback" not in out.err
            assert out.out == ""  # refused before the header, let alone the benchmark
        args = ensemble.parse_args(["--trace", str(tmp_path / "t.json")])
        assert args.trace == str(tmp_path / "t.json")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class TestExampleProgress:
    def test_bar_on_a_terminal(self, examples: tuple[ModuleType, ModuleType]) -> None:
        """On a terminal: one bar redrawn in place, cleared at the end."""
        term = _Terminal()
        progress = examples[0].Progress(term, 4)
        progress.run_done(0, 1, "warm-up", None)
        for name, seconds in (("sequential", 2.0), ("manual forks", 1.2), ("automatic", 1.1)):
            progress.run_done(1, 1, name, seconds)
        progress.close()
        text = term.getvalue()
        assert "\n" not in text
        assert text.count("\r\x1b[K") == 5
        assert "[######..................] 1/4 runs  warm-up" in text
        assert "[########################] 4/4 runs  round 1/1: automatic 1100.0 ms" in text
        assert text.endswith("\r\x1b[K")

    def test_lines_otherwise(self, examples: tuple[ModuleType, ModuleType]) -> None:
        """Not a terminal: one line per finished round, nothing else."""
        log = io.StringIO()
        progress = examples[0].Progress(log, 7)
        progress.run_done(0, 2, "warm-up", None)
        for r in (1, 2):
            for name in ("sequential", "manual forks", "automatic"):
                progress.run_done(r, 2, name, 0.5)
        progress.close()
        assert log.getvalue().splitlines() == [
            f"round {r}/2: sequential 500.0 ms, manual forks 500.0 ms, automatic 500.0 ms"
            for r in (1, 2)
        ]

    def test_quiet(
        self, examples: tuple[ModuleType, ModuleType], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--quiet: the results on stdout, nothing on stderr."""
        assert examples[0].main(["--small", "--rounds", "1", "--quiet"]) == 0
        out, err = capsys.readouterr()
        assert "median time" in out and err == ""

    def test_three_ways_agree(self, examples: tuple[ModuleType, ModuleType]) -> None:
        """Sequential, forked and automatic give the numpy reference's output."""
        mod, _ = examples
        ens = mod.Ensemble(2, 16, seed=3)
        x = np.random.default_rng(0).random((5, 3, 16), dtype=np.float32)
        result = mod.compare(ens, x, interop_threads=2, intraop_threads=None, rounds=1)
        expected = ref_ensemble(ens, x)
        for y in result["outputs"].values():
            assert np.max(np.abs(y - expected)) <= 1e-5
        assert set(result["speedup"]) == {"sequential", "manual forks", "automatic"}

    def test_model_state_dict_names(self, examples: tuple[ModuleType, ModuleType]) -> None:
        """The example's Ensemble has the tutorial torch model's parameter names."""
        mod, _ = examples
        names = list(mod.Ensemble(2, 4).state_dict())
        assert names[:2] == ["models.0.cell_f.weight_ih_l0", "models.0.cell_f.weight_hh_l0"]
        assert names[-1] == "models.1.cell_b.bias_hh_l0"


class TestServe:
    """examples/serve.py: one runtime for the app, correct answers, a bounded load test."""

    CONFIG: ClassVar[dict[str, int]] = {
        "steps": 6,
        "batch": 3,
        "channels": 16,
        "models": 2,
        "interop_threads": 2,
    }

    @pytest.mark.asyncio
    async def test_seeded_get_and_post(self, examples: tuple[ModuleType, ModuleType]) -> None:
        """GET ?seed= and POST {"seed"} / {"x"} answer the ensemble's true output."""
        from aiohttp.test_utils import TestClient, TestServer

        _, serve = examples
        config = serve.ServeConfig(**self.CONFIG)
        app = serve.create_app(config)
        model = app[serve.MODEL]
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/ensemble", params={"seed": "5"})
            assert resp.status == 200
            expected = ref_ensemble(model, serve.seeded_input(config, 5))
            body = await resp.json()
            assert body["seed"] == 5
            _check_summary(body, expected)

            resp = await client.post("/ensemble", json={"seed": 5})
            body = await resp.json()
            assert body["seed"] == 5
            _check_summary(body, expected)

            x = np.random.default_rng(9).random((4, 2, 16), dtype=np.float32)
            resp = await client.post("/ensemble", json={"x": x.tolist()})
            assert resp.status == 200
            body = await resp.json()
            assert body["seed"] is None
            _check_summary(body, ref_ensemble(model, x))

    @pytest.mark.asyncio
    async def test_every_route_answers_the_same(
        self, examples: tuple[ModuleType, ModuleType]
    ) -> None:
        """/ensemble (batched), /ensemble/compiled and /ensemble/eager give the true output;
        an input of another length runs eagerly (no compile per length)."""
        from aiohttp.test_utils import TestClient, TestServer

        _, serve = examples
        config = serve.ServeConfig(**self.CONFIG)
        app = serve.create_app(config)
        model = app[serve.MODEL]
        expected = ref_ensemble(model, serve.seeded_input(config, 3))
        async with TestClient(TestServer(app)) as client:
            for path, ran in (("", "batched"), ("/compiled", "compiled"), ("/eager", "eager")):
                body = await (await client.get(f"/ensemble{path}", params={"seed": "3"})).json()
                assert body["ran"] == ran
                _check_summary(body, expected)
            x = np.random.default_rng(2).random((3, 2, 16), dtype=np.float32)
            body = await (await client.post("/ensemble", json={"x": x.tolist()})).json()
            assert body["ran"] == "eager"
            _check_summary(body, ref_ensemble(model, x))
            health = await (await client.get("/health")).json()
            assert "batched" in health["compiled"] and "compiled" in health["compiled"]

    @pytest.mark.asyncio
    async def test_a_request_past_its_deadline_is_504_and_its_ops_are_dropped(
        self, examples: tuple[ModuleType, ModuleType]
    ) -> None:
        """A request that outlives the deadline answers 504; its queued ops never run (counted
        from the instrument stream: tasks cancelled without running)."""
        _, serve = examples
        # Long enough that its sequence kernels (milliseconds each) are still queued at the
        # deadline, however fast the machine: on numpy's kernels (numba's ran a whole forward
        # of this size within the 2 ms in some runs, and the request answered 200).
        engine = ops.get_recurrent_engine()
        ops.set_recurrent_engine("numpy")
        try:
            await self._past_deadline(serve)
        finally:
            ops.set_recurrent_engine(engine)

    async def _past_deadline(self, serve: ModuleType) -> None:
        from aiohttp.test_utils import TestClient, TestServer

        config = serve.ServeConfig(**{**self.CONFIG, "steps": 600}, deadline=0.002)
        app = serve.create_app(config)
        dropped: list[Any] = []

        class Drops(dataflow.Instrument):
            def task_cancelled(self, ts: int, task: Any) -> None:
                dropped.append(task)

        async with TestClient(TestServer(app)) as client:
            app[serve.RUNTIME].add_instrument(Drops())
            x = np.random.default_rng(0).random((600, 3, 16), dtype=np.float32)
            resp = await client.post("/ensemble/eager", json={"x": x.tolist()})
            assert resp.status == 504
            assert "deadline" in (await resp.json())["error"]
            runtime = app[serve.RUNTIME]
            for _ in range(500):  # the ops already running finish; the rest were dropped
                if runtime._inflight == 0:
                    break
                await asyncio.sleep(0.01)
            assert runtime._inflight == 0
        assert dropped, "the timed-out request's queued ops were not dropped"

    @pytest.mark.asyncio
    async def test_trace_endpoint_gives_a_chrome_trace(
        self, examples: tuple[ModuleType, ModuleType]
    ) -> None:
        """/trace answers the recent timeline (the warm-up and requests) as Chrome JSON."""
        from aiohttp.test_utils import TestClient, TestServer

        _, serve = examples
        app = serve.create_app(serve.ServeConfig(**self.CONFIG))
        async with TestClient(TestServer(app)) as client:
            await client.get("/ensemble", params={"seed": "1"})
            resp = await client.get("/trace")
            assert resp.status == 200
            doc = await resp.json()
        names = {e.get("name") for e in doc["traceEvents"]}
        assert "lstm_sequence" in names

    @pytest.mark.asyncio
    async def test_warm_up_compiles_before_the_first_request(
        self, examples: tuple[ModuleType, ModuleType]
    ) -> None:
        """At startup both compiled forwards are traced and gc.freeze() is called (undone
        when the app stops)."""
        import gc

        from aiohttp.test_utils import TestClient, TestServer

        _, serve = examples
        app = serve.create_app(serve.ServeConfig(**self.CONFIG))
        frozen_before = gc.get_freeze_count()
        async with TestClient(TestServer(app)):
            assert gc.get_freeze_count() > frozen_before
            # every padded batch size traced for the batched forward, one signature unbatched
            assert len(app[serve.BATCHED].programs) > 1
            assert "signatures=1" in repr(app[serve.COMPILED])
        assert gc.get_freeze_count() == 0

    @pytest.mark.asyncio
    async def test_concurrent_requests_share_one_runtime(
        self, examples: tuple[ModuleType, ModuleType]
    ) -> None:
        """Eight requests at once all answer right, through the app's one runtime."""
        from aiohttp.test_utils import TestClient, TestServer

        _, serve = examples
        config = serve.ServeConfig(**self.CONFIG)
        app = serve.create_app(config)
        seen = RuntimeRecorder()
        async with TestClient(TestServer(app)) as client:
            runtime = app[serve.RUNTIME]
            dataflow.add_instrument(seen)
            try:
                resps = await asyncio.gather(
                    *(client.get("/ensemble", params={"seed": str(s)}) for s in range(8))
                )
                bodies = [await r.json() for r in resps]
            finally:
                dataflow.remove_instrument(seen)
            assert app[serve.RUNTIME] is runtime
            # Every op of every request ran in the app's runtime (inline or on its pool).
            assert seen.runtimes == {id(runtime)}
            # At least one launch's ops (one per LSTM direction of every member); concurrent
            # requests are batched, so eight requests may share a few launches.
            assert seen.count >= config.models * 2
            health = await (await client.get("/health")).json()
            assert health["ok"] and "interop=2" in health["runtime"]
        for s, body in enumerate(bodies):
            _check_summary(body, ref_ensemble(app[serve.MODEL], serve.seeded_input(config, s)))
        assert "closed" in repr(runtime)

    @pytest.mark.asyncio
    async def test_bad_input_is_400(self, examples: tuple[ModuleType, ModuleType]) -> None:
        """Wrong shapes, bad seeds and non-JSON bodies are refused with a reason."""
        from aiohttp.test_utils import TestClient, TestServer

        _, serve = examples
        app = serve.create_app(serve.ServeConfig(**self.CONFIG))
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/ensemble", json={"x": [[[1.0, 2.0]]]})
            assert resp.status == 400
            assert "(steps, batch, 16)" in (await resp.json())["error"]
            resp = await client.get("/ensemble", params={"seed": "abc"})
            assert resp.status == 400
            resp = await client.post("/ensemble", data=b"not json")
            assert resp.status == 400
            resp = await client.post("/ensemble", json={"seed": 1, "x": []})
            assert resp.status == 400

    @pytest.mark.asyncio
    async def test_hostile_bodies_are_400_with_a_reason(
        self, examples: tuple[ModuleType, ModuleType]
    ) -> None:
        """Bodies that broke the server (a 500 and a traceback) or got a non-JSON answer are
        refused with a 400 and a reason: JSON nested past the recursion limit, a 5000-digit
        integer, an unknown charset, a seed of Infinity, 1.5 or true, and an "x" holding an
        integer past float range, 1e39, NaN, Infinity, null or strings."""
        from aiohttp.test_utils import TestClient, TestServer

        _, serve = examples
        app = serve.create_app(serve.ServeConfig(**self.CONFIG, warm_up=False))
        row = ", ".join(["0.5"] * 15)  # one row of 16 channels is {row}, VALUE
        cases: list[tuple[bytes, str, str]] = [
            (b"[" * 100_000, "application/json", "nests too deeply"),
            (b'{"seed": ' + b"1" * 5000 + b"}", "application/json", "must be JSON"),
            (b'{"seed": 1}', "application/json; charset=no-such-codec", "JSON text"),
            (b'{"seed": Infinity}', "application/json", "non-negative integer"),
            (b'{"seed": 1.5}', "application/json", "non-negative integer"),
            (b'{"seed": true}', "application/json", "non-negative integer"),
            (b'{"seed": "-3"}', "application/json", "non-negative integer"),
        ]
        for value, says in (
            ("1" + "0" * 400, "numbers"),
            ("1e39", "finite"),
            ("1e400", "finite"),
            ("NaN", "finite"),
            ("-Infinity", "finite"),
            ("null", "numbers"),
            ('"1.0"', "numbers"),
        ):
            body = f'{{"x": [[[{row}, {value}]]]}}'.encode()
            cases.append((body, "application/json", says))
        async with TestClient(TestServer(app)) as client:
            for body, content_type, says in cases:
                resp = await client.post(
                    "/ensemble", data=body, headers={"Content-Type": content_type}
                )
                assert resp.status == 400, (body[:60], await resp.text())
                assert says in (await resp.json())["error"], body[:60]
            # the seed's decimal text still works, and the server still answers
            resp = await client.post("/ensemble", json={"seed": "+7"})
            assert resp.status == 200 and (await resp.json())["seed"] == 7
            resp = await client.post("/ensemble", json={"x": [[[True] * 16]]})
            assert resp.status == 400 and "bool" in (await resp.json())["error"]

    @pytest.mark.asyncio
    async def test_a_big_body_is_parsed_off_the_loop(
        self, examples: tuple[ModuleType, ModuleType], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A posted body over PARSE_ON_LOOP_BYTES is parsed on a thread (1 MiB of JSON
        numbers held the loop for about 20 ms); a small one on the loop. Both answer right."""
        from aiohttp.test_utils import TestClient, TestServer

        _, serve = examples
        config = serve.ServeConfig(**self.CONFIG, warm_up=False)
        app = serve.create_app(config)
        parse = serve.parse_body
        threads: list[int] = []

        def spy(*args: Any) -> Any:
            threads.append(threading.get_ident())
            return parse(*args)

        monkeypatch.setattr(serve, "parse_body", spy)
        rng = np.random.default_rng(4)
        small = rng.random((1, 3, 16), dtype=np.float32)
        big = rng.random((300, 3, 16), dtype=np.float32)
        async with TestClient(TestServer(app)) as client:
            for x in (small, big):
                resp = await client.post("/ensemble/eager", json={"x": x.tolist()})
                assert resp.status == 200
                _check_summary(await resp.json(), ref_ensemble(app[serve.MODEL], x))
        assert len(json.dumps({"x": big.tolist()})) > serve.PARSE_ON_LOOP_BYTES
        loop_thread = threading.get_ident()
        assert threads[0] == loop_thread and threads[1] != loop_thread

    @pytest.mark.asyncio
    async def test_trace_is_built_off_the_loop(
        self, examples: tuple[ModuleType, ModuleType], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """/trace builds and writes the trace on a thread: on the loop, a minute of a busy
        server's tasks stalled every request for as long as the dump took."""
        from aiohttp.test_utils import TestClient, TestServer

        _, serve = examples
        app = serve.create_app(serve.ServeConfig(**self.CONFIG, warm_up=False))
        dump = serve.dump_trace
        threads: list[int] = []

        def spy(app: Any, path: str) -> str:
            threads.append(threading.get_ident())
            return dump(app, path)  # type: ignore[no-any-return]

        monkeypatch.setattr(serve, "dump_trace", spy)
        async with TestClient(TestServer(app)) as client:
            await client.get("/ensemble", params={"seed": "1"})
            resps = await asyncio.gather(*(client.get("/trace") for _ in range(3)))
            assert [r.status for r in resps] == [200] * 3
            doc = await resps[0].json()
            assert "lstm_sequence" in {e.get("name") for e in doc["traceEvents"]}
        assert len(threads) == 3
        assert threading.get_ident() not in threads

    @pytest.mark.asyncio
    async def test_trace_clients_that_leave_do_not_start_dumps_side_by_side(
        self, examples: tuple[ModuleType, ModuleType], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A /trace client that disconnects mid-dump keeps the one-dump-at-a-time lock until
        its thread is done: the next /trace waits for it instead of starting a second dump
        beside it (clients coming and going could run any number at once)."""
        from aiohttp import web

        _, serve = examples
        app = serve.create_app(serve.ServeConfig(**self.CONFIG, warm_up=False))
        dump = serve.dump_trace
        gate = threading.Event()
        started: list[int] = []

        def slow(app: Any, path: str) -> str:
            started.append(1)
            gate.wait(30)
            return dump(app, path)  # type: ignore[no-any-return]

        monkeypatch.setattr(serve, "dump_trace", slow)
        runner = web.AppRunner(app, **serve.SERVER_OPTIONS)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            await serve.in_runtime(app, _forward_once(app[serve.MODEL], self.CONFIG))
            request = b"GET /trace HTTP/1.1\r\nHost: test\r\n\r\n"
            _, first = await asyncio.open_connection("127.0.0.1", port)
            first.write(request)
            for _ in range(1000):
                if started:
                    break
                await asyncio.sleep(0.01)
            first.close()  # the first client leaves mid-dump
            await first.wait_closed()
            reader, second = await asyncio.open_connection("127.0.0.1", port)
            second.write(request)
            lock = app[serve.TRACE_LOCK]
            for _ in range(1000):  # the second handler waits for the lock
                if lock._waiters:
                    break
                await asyncio.sleep(0.01)
            assert lock._waiters and started == [1]
            gate.set()
            status = await reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            second.close()
            assert started == [1, 1]
        finally:
            gate.set()
            await runner.cleanup()

    @pytest.mark.asyncio
    async def test_trace_buffer_is_bounded_by_count_too(
        self, examples: tuple[ModuleType, ModuleType]
    ) -> None:
        """The rolling trace keeps at most ``trace_spans`` task records, whatever the load
        (bounded by age alone, it grew with the request rate)."""
        from aiohttp.test_utils import TestClient, TestServer

        _, serve = examples
        config = serve.ServeConfig(**self.CONFIG, warm_up=False, trace_spans=5)
        app = serve.create_app(config)
        async with TestClient(TestServer(app)) as client:
            for seed in range(3):
                resp = await client.get("/ensemble/eager", params={"seed": str(seed)})
                assert resp.status == 200
            recorder = app[serve.RECORDER]
            assert 0 < len(recorder.tasks) <= 5
            assert (await client.get("/trace")).status == 200

    @pytest.mark.asyncio
    async def test_a_client_that_disconnects_has_its_queued_ops_dropped(
        self, examples: tuple[ModuleType, ModuleType]
    ) -> None:
        """The server runs with aiohttp's handler_cancellation (SERVER_OPTIONS): a client that
        goes away mid-request cancels its handler, and the runtime drops the request's queued
        ops. By default aiohttp let the handler run on, and every op ran for nobody."""
        _, serve = examples
        engine = ops.get_recurrent_engine()
        ops.set_recurrent_engine("numpy")  # kernels long enough to queue (not run inline)
        try:
            await self._client_leaves(serve)
        finally:
            ops.set_recurrent_engine(engine)

    async def _client_leaves(self, serve: ModuleType) -> None:
        from aiohttp import web

        from tests._helpers import gated

        config = serve.ServeConfig(**{**self.CONFIG, "steps": 600}, warm_up=False)
        app = serve.create_app(config)
        dropped: list[Any] = []

        class Drops(dataflow.Instrument):
            def task_cancelled(self, ts: int, task: Any) -> None:
                dropped.append(task)

        async def hold_the_pool(gate: threading.Event) -> list[Any]:
            return [gated(np.ones(1), gate) for _ in range(config.interop_threads)]

        runner = web.AppRunner(app, **serve.SERVER_OPTIONS)
        await runner.setup()
        gate = threading.Event()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            runtime = app[serve.RUNTIME]
            runtime.add_instrument(Drops())
            # Every pool thread held, so the request's big kernels stay queued.
            held = await serve.in_runtime(app, hold_the_pool(gate))
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /ensemble/eager?seed=1 HTTP/1.1\r\nHost: test\r\n\r\n")
            await writer.drain()
            for _ in range(1000):  # the handler dispatched the model's ops
                if runtime._inflight > len(held):
                    break
                await asyncio.sleep(0.01)
            assert runtime._inflight > len(held)
            writer.close()  # the client goes away
            await writer.wait_closed()
            for _ in range(1000):
                if dropped:
                    break
                await asyncio.sleep(0.01)
            assert dropped, "the queued ops of a request whose client left were not dropped"
            assert all(t.op != "gated" for t in dropped)
        finally:
            gate.set()
            await runner.cleanup()

    def test_serve_runs_with_handler_cancellation(
        self, examples: tuple[ModuleType, ModuleType], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`serve.py serve` starts aiohttp with SERVER_OPTIONS (handler_cancellation)."""
        _, serve = examples
        seen: dict[str, Any] = {}
        monkeypatch.setattr(serve.web, "run_app", lambda app, **kw: seen.update(kw))
        assert serve.main(["serve", "--port", "0", "-C", "16", "--models", "1"]) == 0
        assert seen["handler_cancellation"] is True and seen["port"] == 0

    def test_address_that_cannot_be_served_is_one_line(
        self,
        examples: tuple[ModuleType, ModuleType],
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """An unknown host or a port in use: one line naming the address, exit 1."""
        _, serve = examples

        def run_app(app: Any, **kw: Any) -> None:
            raise OSError(98, "Address already in use")

        monkeypatch.setattr(serve.web, "run_app", run_app)
        assert serve.main(["serve", "--host", "127.0.0.1", "--port", "8080"]) == 1
        err = capsys.readouterr().err
        said = "serve.py: cannot serve on 127.0.0.1:8080: [Errno 98] Address already in use\n"
        assert err == said

    @pytest.mark.asyncio
    async def test_load_generator(self, examples: tuple[ModuleType, ModuleType]) -> None:
        """bench() serves on 127.0.0.1 and reports every level's throughput and latencies."""
        _, serve = examples
        out = io.StringIO()

        def write(line: str) -> None:
            out.write(line + "\n")

        results = await serve.bench(
            serve.ServeConfig(**self.CONFIG), levels=(1, 4), requests=6, out=write
        )
        assert [r.concurrency for r in results] == [1, 4]
        assert all(r.requests == 6 and r.throughput > 0 for r in results)
        assert all(0 < r.p50_ms <= r.p99_ms for r in results)
        assert "req/s" in out.getvalue() and '"serve_bench"' in out.getvalue()

    @pytest.mark.parametrize(
        ("args", "says"),
        [
            (["--levels", "0"], "argument --levels: client counts must be at least 1, got 0"),
            (["--levels", "1,-2"], "argument --levels: client counts must be at least 1, got -2"),
            (["--levels", "a,b"], "argument --levels: 'a' is not an int"),
            (["--levels", ","], "argument --levels: no client counts"),
            (["--requests", "0"], "argument --requests: must be at least 1, got 0"),
            (["--requests", "x"], "argument --requests: not an int"),
            (["--port", "-1"], "argument --port: a port is 0 to 65535, got -1"),
            (["--port", "65536"], "argument --port: a port is 0 to 65535, got 65536"),
            (["--steps", "0"], "argument --steps/-T: must be at least 1, got 0"),
            (["--models", "-2"], "argument --models: must be at least 1, got -2"),
            (["--intraop-threads", "0"], "argument --intraop-threads: must be at least 1, got 0"),
        ],
    )
    def test_bad_bench_arguments_are_usage_errors(
        self,
        examples: tuple[ModuleType, ModuleType],
        capsys: pytest.CaptureFixture[str],
        args: list[str],
        says: str,
    ) -> None:
        """Bad --levels, --requests, --port or sizes: argparse's one-line error (exit 2),
        nothing served (a bad port or size was a traceback from bind() or the model)."""
        _, serve = examples
        with pytest.raises(SystemExit) as exc:
            serve.main(["bench", *args])
        assert exc.value.code == 2
        out = capsys.readouterr()
        assert says in out.err and "Traceback" not in out.err
        assert out.out == ""

    def test_runtime_in_a_plain_asyncio_run(self, examples: tuple[ModuleType, ModuleType]) -> None:
        """The app also works when started by an AppRunner in asyncio.run (no pytest loop)."""
        from aiohttp import ClientSession, web

        _, serve = examples
        config = serve.ServeConfig(**self.CONFIG)

        async def main() -> dict[str, Any]:
            app = serve.create_app(config)
            runner = web.AppRunner(app)
            await runner.setup()
            try:
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                port = runner.addresses[0][1]
                async with (
                    ClientSession() as session,
                    session.get(f"http://127.0.0.1:{port}/ensemble?seed=2") as resp,
                ):
                    body: dict[str, Any] = await resp.json()
                    return body
            finally:
                await runner.cleanup()

        body = asyncio.run(main())
        app = serve.create_app(config)
        _check_summary(body, ref_ensemble(app[serve.MODEL], serve.seeded_input(config, 2)))
        assert dataflow.current_runtime() is None


class TestGraphDocExample:
    """docs/graph.md's ensemble example (IR, code, saved JSON) is what the code gives today."""

    @staticmethod
    def _block(doc: str, after: str, fence: str) -> str:
        start = doc.index(fence + "\n", doc.index(after)) + len(fence) + 1
        return doc[start : doc.index("```\n", start)]

    def test_doc_matches_a_real_trace(
        self, examples: tuple[ModuleType, ModuleType], tmp_path: Path
    ) -> None:
        import json
        import re
        import zipfile

        ensemble, _ = examples
        doc = (ROOT / "docs" / "graph.md").read_text()
        x = np.random.default_rng(1).random((3, 2, 4), dtype=np.float32)
        graph = dataflow.trace(ensemble.Ensemble(1, 4, seed=0), x)
        assert self._block(doc, "`Ensemble(1, 4)` traced with", "```text") == str(graph) + "\n"
        code = graph.optimize().code.splitlines()
        shown = self._block(doc, "`graph.optimize().code` begins:", "```python").splitlines()
        assert shown[:4] == code[:4] and shown[-2:] == code[-2:]
        path = tmp_path / "g.dfg"
        graph.save(str(path))
        with zipfile.ZipFile(path) as zf:
            saved = json.loads(zf.read("graph.json"))
        shown_json = self._block(doc, "**`graph.json`**", "```json")
        real_ops = {node["op"] for node in saved["nodes"]}
        assert set(re.findall(r'"op": "([^"]+)"', shown_json)) <= real_ops
        assert f'"location": "{saved["nodes"][0]["location"]}"' in shown_json
        assert f'"outputs": {json.dumps(saved["outputs"])}' in shown_json
