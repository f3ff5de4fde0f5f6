"""ops.nn: Module, Linear, LSTM and GRU against plain numpy and torch; state dicts; overlap."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from ops import nn

Array = np.ndarray[Any, Any]
TOL = 1e-5


# -- plain numpy references -------------------------------------------------------------------


def _sigmoid(a: Array) -> Array:
    out: Array = np.exp(-np.logaddexp(0.0, -a))
    return out


def _lstm_step(x: Array, h: Array, c: Array, p: dict[str, Array], sfx: str) -> tuple[Array, Array]:
    gates = x @ p["weight_ih" + sfx].T + h @ p["weight_hh" + sfx].T
    if "bias_ih" + sfx in p:
        gates = gates + p["bias_ih" + sfx] + p["bias_hh" + sfx]
    i, f, g, o = np.split(gates, 4, axis=-1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    return _sigmoid(o) * np.tanh(c), c


def _gru_step(x: Array, h: Array, c: Array, p: dict[str, Array], sfx: str) -> tuple[Array, Array]:
    gi = x @ p["weight_ih" + sfx].T
    gh = h @ p["weight_hh" + sfx].T
    if "bias_ih" + sfx in p:
        gi = gi + p["bias_ih" + sfx]
        gh = gh + p["bias_hh" + sfx]
    i_r, i_z, i_n = np.split(gi, 3, axis=-1)
    h_r, h_z, h_n = np.split(gh, 3, axis=-1)
    r, z = _sigmoid(i_r + h_r), _sigmoid(i_z + h_z)
    n = np.tanh(i_n + r * h_n)
    return (1.0 - z) * n + z * h, c


def ref_rnn(
    mode: str,
    params: dict[str, Array],
    x: Array,
    h0: Array | None,
    c0: Array | None,
    num_layers: int,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Array, Array, Array]:
    """torch.nn.LSTM / GRU's forward written as loops, in float64: (output, h_n, c_n)."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    step = _lstm_step if mode == "LSTM" else _gru_step
    seq = x.astype(np.float64)
    if batch_first:
        seq = seq.swapaxes(0, 1)
    steps, batch = seq.shape[:2]
    hidden = p["weight_hh_l0"].shape[1]
    dirs = 2 if bidirectional else 1
    zeros = np.zeros((num_layers * dirs, batch, hidden))
    h0 = zeros if h0 is None else h0.astype(np.float64)
    c0 = zeros if c0 is None else c0.astype(np.float64)
    h_n, c_n = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            h, c = h0[k], c0[k]
            out = np.zeros((steps, batch, hidden))
            for t in range(steps) if d == 0 else reversed(range(steps)):
                h, c = step(seq[t], h, c, p, sfx)
                out[t] = h
            outs.append(out)
            h_n.append(h)
            c_n.append(c)
        seq = np.concatenate(outs, axis=2)
    if batch_first:
        seq = seq.swapaxes(0, 1)
    return seq, np.stack(h_n), np.stack(c_n)


def _diff(a: Any, b: Any) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b))))


def _rand(seed: int, *shape: int) -> Array:
    out: Array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return out


# -- the tutorial's ensemble, as in REFERENCE.md ----------------------------------------------


class BiLSTM(nn.Module):
    """One LSTM forward in time, one over the flipped input; outputs concatenated."""

    def __init__(self, c: int, seed: int) -> None:
        self.cell_f = nn.LSTM(c, c, seed=seed)
        self.cell_b = nn.LSTM(c, c, seed=seed + 1)

    async def forward(self, x: Any) -> ops.Tensor:
        out_f, _ = await self.cell_f(x)
        out_b, _ = await self.cell_b(ops.flip(x, axis=0))
        out: ops.Tensor = ops.concatenate([out_f, ops.flip(out_b, axis=0)], axis=2)
        return out


class Ensemble(nn.Module):
    """n BiLSTMs on the same input, stacked and summed."""

    def __init__(self, n: int, c: int) -> None:
        self.models = [BiLSTM(c, seed=2 * i) for i in range(n)]

    async def forward(self, x: Any) -> ops.Tensor:
        results = [await m(x) for m in self.models]
        out: ops.Tensor = ops.sum(ops.stack(results), axis=0)
        return out


class Recorder(dataflow.Instrument):
    """Records (event, task name, timestamp) for every task start and finish."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()

    def task_started(self, ts: int, task: Any) -> None:
        with self._lock:
            self.events.append(("start", task.name, ts))

    def task_finished(self, ts: int, task: Any) -> None:
        with self._lock:
            self.events.append(("finish", task.name, ts))


# -- tests ------------------------------------------------------------------------------------


class TestModule:
    """Module finds parameters and children by attribute, without super().__init__()."""

    class Net(nn.Module):
        """A user subclass that does not call super().__init__()."""

        def __init__(self) -> None:
            self.scale = np.ones(3, np.float32)
            self.fc = nn.Linear(3, 2, seed=0)
            self.blocks = [nn.Linear(2, 2, seed=1), nn.Linear(2, 2, seed=2)]
            self.heads = {"a": nn.Linear(2, 1, seed=3)}
            self._private = np.zeros(1)
            self.note = "not a parameter"

        async def forward(self, x: Any) -> Any:
            y = await self.fc(x * self.scale)
            for b in self.blocks:
                y = await b(y)
            return await self.heads["a"](y)

    def test_named_parameters_in_torch_order(self) -> None:
        """Own arrays first, then children in assignment order, list items by index."""
        names = [k for k, _ in self.Net().named_parameters()]
        assert names == [
            "scale",
            "fc.weight",
            "fc.bias",
            "blocks.0.weight",
            "blocks.0.bias",
            "blocks.1.weight",
            "blocks.1.bias",
            "heads.a.weight",
            "heads.a.bias",
        ]

    def test_parameters_and_children(self) -> None:
        """parameters() yields the arrays; named_children the direct submodules."""
        net = self.Net()
        assert len(list(net.parameters())) == 9
        assert [k for k, _ in net.named_children()] == ["fc", "blocks.0", "blocks.1", "heads.a"]
        assert [k for k, _ in net.named_modules()][:2] == ["", "fc"]

    def test_shared_parameter_listed_once(self) -> None:
        """A module reachable twice contributes its parameters once to named_parameters."""
        net = self.Net()
        net.blocks.append(net.fc)
        assert len(list(net.parameters())) == 9

    def test_call_awaits_forward(self) -> None:
        """await module(x) runs forward; eager outside a runtime."""

        async def main() -> Array:
            out: Array = await self.Net()(np.ones((4, 3), np.float32))
            return out

        assert dataflow.run(main).shape == (4, 1)

    def test_sync_forward_allowed(self) -> None:
        """A plain def forward works too."""

        class Plain(nn.Module):
            def forward(self, x: Any) -> Any:
                return x + 1

        async def main() -> Any:
            return await Plain()(1)

        assert dataflow.run(main) == 2

    def test_sync_forward_returning_a_tensor_keeps_it_pending(self) -> None:
        """A plain def forward's pending result stays pending inside another forward, as an
        async forward's does, so the model traces and compiles (it was awaited: the trace
        saw its value used and compile refused the model)."""

        class Plain(nn.Module):
            def forward(self, x: Any) -> Any:
                return ops.tanh(x)

        class Outer(nn.Module):
            def __init__(self) -> None:
                self.inner = Plain()

            async def forward(self, x: Any) -> Any:
                y = await self.inner(x)
                assert isinstance(y, ops.Tensor)
                return ops.multiply(y, 2.0)

        x1, x2 = _rand(0, 4, 3), _rand(1, 4, 3)
        forward = dataflow.compile(Outer())

        async def main() -> tuple[Array, Array, Array]:
            return await Outer()(x1), await forward(x1), await forward(x2)

        eager, y1, y2 = dataflow.run(main)
        assert np.allclose(eager, 2 * np.tanh(x1)) and np.allclose(y1, eager)
        assert np.allclose(y2, 2 * np.tanh(x2))

    def test_missing_forward(self) -> None:
        """A module without forward says what to define."""

        async def main() -> Any:
            return await nn.Module()(1)

        with pytest.raises(NotImplementedError, match="async def forward"):
            dataflow.run(main)

    def test_repr(self) -> None:
        """The repr shows the tree, like torch's."""
        text = repr(self.Net())
        assert "(fc): Linear(in_features=3, out_features=2, bias=True)" in text
        assert "(blocks.1): Linear" in text
        assert repr(nn.LSTM(4, 8, num_layers=2, bidirectional=True)) == (
            "LSTM(4, 8, num_layers=2, bidirectional=True)"
        )


class TestLinear:
    """nn.Linear is x @ W.T + b with torch's init."""

    def test_matches_numpy(self) -> None:
        """Output equals numpy's, in float32, for batched input."""
        fc = nn.Linear(6, 4, seed=0)
        x = _rand(1, 2, 3, 6)

        async def main() -> Array:
            y = await fc.forward(x)
            assert y.shape == (2, 3, 4) and y.dtype == np.float32
            out: Array = await y
            return out

        y = dataflow.run(main)
        assert y.dtype == np.float32
        assert _diff(y, x.astype(np.float64) @ fc.weight.T + fc.bias) <= TOL

    def test_no_bias(self) -> None:
        """bias=False has no bias parameter."""
        fc = nn.Linear(3, 2, bias=False)
        assert [k for k, _ in fc.named_parameters()] == ["weight"]

    def test_init_range(self) -> None:
        """weight and bias are U(-1/sqrt(in), 1/sqrt(in)), float32."""
        fc = nn.Linear(100, 50, seed=3)
        bound = 1 / np.sqrt(100)
        for p in fc.parameters():
            assert p.dtype == np.float32
            assert np.all(np.abs(p) <= bound) and np.max(np.abs(p)) > 0.9 * bound

    def test_errors(self) -> None:
        """Wrong features or dtype raise at the call, naming the module."""
        fc = nn.Linear(3, 2)

        async def main() -> None:
            with pytest.raises(dataflow.OpInputError, match=r"nn.Linear: .*in_features=3"):
                await fc(np.ones((2, 4), np.float32))
            with pytest.raises(dataflow.OpTypeError, match=r"nn.Linear: x has dtype float64"):
                await fc(np.ones((2, 3)))

        dataflow.run(main)
        with pytest.raises(dataflow.DataflowValueError, match="in_features must be a positive int"):
            nn.Linear(0, 2)
        with pytest.raises(dataflow.DataflowTypeError, match="out_features must be a positive int"):
            nn.Linear(2, 1.5)  # type: ignore[arg-type]

    def test_numpy_integer_sizes_accepted(self) -> None:
        """nn.Linear(np.prod(shape), n) builds, as in torch and as nn.LSTM takes numpy
        integers (it was a DataflowTypeError); the sizes are stored as Python ints."""
        fc = nn.Linear(np.prod((2, 3)), np.int32(4))  # type: ignore[arg-type]
        assert fc.weight.shape == (4, 6)
        assert type(fc.in_features) is int and type(fc.out_features) is int

    @pytest.mark.parametrize("dtype", ["int32", np.int64, np.bool_, np.complex64], ids=str)
    def test_non_floating_dtype_refused(self, dtype: Any) -> None:
        """dtype='int32' is refused naming the argument (its weights would all be 0)."""
        with pytest.raises(dataflow.DataflowTypeError, match=r"nn.Linear: dtype must be a float"):
            nn.Linear(3, 4, dtype=dtype)

    def test_unknown_dtype_refused(self) -> None:
        """dtype='banana' names the argument."""
        with pytest.raises(TypeError, match=r"nn.Linear: dtype 'banana' is not a numpy dtype"):
            nn.Linear(3, 4, dtype="banana")

    @pytest.mark.parametrize("dtype", [np.float16, "float64", np.dtype(np.float32)], ids=str)
    def test_floating_dtypes_accepted(self, dtype: Any) -> None:
        """Every floating dtype gives non-zero weights of that dtype."""
        fc = nn.Linear(3, 4, dtype=dtype, seed=0)
        assert fc.weight.dtype == np.dtype(dtype) and np.any(fc.weight != 0)

    @pytest.mark.parametrize("flag", ["False", "no", 0, 1, None], ids=repr)
    def test_bias_flag_must_be_a_bool(self, flag: Any) -> None:
        """bias='False' is refused rather than read as True by truthiness."""
        with pytest.raises(dataflow.DataflowTypeError, match=r"nn.Linear: bias must be True or"):
            nn.Linear(3, 4, bias=flag)

    @pytest.mark.parametrize(
        ("kw", "match"),
        [
            ({"rng": 42}, r"nn.Linear: rng must be a numpy.random.Generator, got int"),
            ({"seed": "a"}, r"nn.Linear: seed must be None or a non-negative int, got str"),
            ({"seed": -1}, r"nn.Linear: seed must be None or a non-negative int, got int"),
        ],
        ids=repr,
    )
    def test_bad_seed_or_rng_named(self, kw: dict[str, Any], match: str) -> None:
        """A bad seed or rng is a DataflowError naming it (was numpy's AttributeError
        "'int' object has no attribute 'uniform'", or a SeedSequence message)."""
        with pytest.raises(dataflow.DataflowError, match=match):
            nn.Linear(2, 2, **kw)

    def test_numpy_bool_flag_accepted(self) -> None:
        """np.False_ is a real bool."""
        flag: Any = np.False_
        assert nn.Linear(3, 4, bias=flag).bias is None

    @pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
    def test_subclass_input_refused(self) -> None:
        """A masked array or np.matrix input is refused at the call, naming nn.Linear."""
        fc = nn.Linear(2, 2)

        async def main() -> None:
            x = np.ma.masked_array(np.ones((1, 2), np.float32), mask=[[False, True]])
            with pytest.raises(dataflow.OpTypeError, match=r"nn.Linear: x is a np\.ma\."):
                await fc(x)
            with pytest.raises(dataflow.OpTypeError, match=r"nn.Linear: x is a np\.matrix"):
                await fc(np.matrix([[1.0, 2.0]], np.float32))
            with pytest.raises(dataflow.OpTypeError, match=r"nn.Linear: x has type NoneType"):
                await fc(None)

        dataflow.run(main)


CONFIGS = list(itertools.product(["LSTM", "GRU"], [1, 2], [False, True], [False, True]))


class TestRecurrent:
    """LSTM and GRU match a plain numpy forward for every layout."""

    @pytest.mark.parametrize(("mode", "layers", "bidirectional", "batch_first"), CONFIGS)
    @pytest.mark.parametrize("with_state", [False, True])
    def test_matches_numpy_reference(
        self, mode: str, layers: int, bidirectional: bool, batch_first: bool, with_state: bool
    ) -> None:
        """output, h_n (and c_n) equal the numpy loops within 1e-5."""
        steps, batch, inp, hidden = 5, 3, 4, 6
        dirs = 2 if bidirectional else 1
        cls = nn.LSTM if mode == "LSTM" else nn.GRU
        m = cls(inp, hidden, layers, batch_first=batch_first, bidirectional=bidirectional, seed=7)
        x = _rand(1, batch, steps, inp) if batch_first else _rand(1, steps, batch, inp)
        h0 = _rand(2, layers * dirs, batch, hidden) if with_state else None
        c0 = _rand(3, layers * dirs, batch, hidden) if with_state else None

        forward: Any = m.forward  # the pending outputs (a module call at the top gives arrays)

        async def main() -> Any:
            if mode == "LSTM":
                out, (h_n, c_n) = await forward(x, None if h0 is None else (h0, c0))
            else:
                out, h_n = await forward(x, h0)
                c_n = None
            assert isinstance(out, ops.Tensor) and isinstance(h_n, ops.Tensor)
            return out, h_n, c_n

        out, h_n, c_n = dataflow.run(main, interop_threads=2)
        r_out, r_h, r_c = ref_rnn(
            mode, m.state_dict(), x, h0, c0, layers, bidirectional, batch_first
        )
        expected = (batch, steps, dirs * hidden) if batch_first else (steps, batch, dirs * hidden)
        assert out.shape == expected and out.dtype == np.float32
        assert h_n.shape == (layers * dirs, batch, hidden)
        assert _diff(out, r_out) <= TOL
        assert _diff(h_n, r_h) <= TOL
        if mode == "LSTM":
            assert _diff(c_n, r_c) <= TOL

    def test_pending_state_input(self) -> None:
        """Initial states may themselves be pending tensors."""
        m = nn.LSTM(4, 5, num_layers=2, seed=1)
        x = _rand(1, 3, 2, 4)
        h0, c0 = _rand(2, 2, 2, 5), _rand(3, 2, 2, 5)

        async def main() -> Any:
            out, (h_n, _) = await m(x, (ops.asarray(h0) * 1.0, ops.asarray(c0) * 1.0))
            return out, h_n

        out, h_n = dataflow.run(main)
        r_out, r_h, _ = ref_rnn("LSTM", m.state_dict(), x, h0, c0, 2, False, False)
        assert _diff(out, r_out) <= TOL
        assert _diff(h_n, r_h) <= TOL

    def test_forward_only_dispatches(self) -> None:
        """forward returns pending tensors with shapes known before anything ran."""
        m = nn.LSTM(8, 16, bidirectional=True, seed=0)
        x = _rand(0, 10, 2, 8)

        async def main() -> None:
            out, (h_n, c_n) = await m.forward(x)
            assert out.shape == (10, 2, 32) and h_n.shape == c_n.shape == (2, 2, 16)
            await out

        dataflow.run(main, interop_threads=1)

    def test_default_init(self) -> None:
        """Parameters are float32 U(-1/sqrt(hidden), 1/sqrt(hidden)), reproducible by seed."""
        m = nn.LSTM(10, 64, num_layers=2, bidirectional=True, seed=5)
        bound = 1 / np.sqrt(64)
        for p in m.parameters():
            assert p.dtype == np.float32
            assert np.all(np.abs(p) <= bound)
        assert np.max(np.abs(m.weight_hh_l1_reverse)) > 0.9 * bound
        same = nn.LSTM(10, 64, num_layers=2, bidirectional=True, seed=5)
        other = nn.LSTM(10, 64, num_layers=2, bidirectional=True, seed=6)
        assert np.array_equal(m.weight_ih_l0, same.weight_ih_l0)
        assert not np.array_equal(m.weight_ih_l0, other.weight_ih_l0)
        gen = nn.GRU(3, 4, rng=np.random.default_rng(5))
        assert gen.weight_ih_l0.shape == (12, 3)
        with pytest.raises(ValueError, match="seed or rng, not both"):
            nn.GRU(3, 4, seed=1, rng=np.random.default_rng(1))

    def test_parameter_names_and_shapes(self) -> None:
        """torch's names, shapes and order."""
        m = nn.LSTM(3, 5, num_layers=2, bidirectional=True)
        shapes = {k: v.shape for k, v in m.named_parameters()}
        assert list(shapes)[:5] == [
            "weight_ih_l0",
            "weight_hh_l0",
            "bias_ih_l0",
            "bias_hh_l0",
            "weight_ih_l0_reverse",
        ]
        assert shapes["weight_ih_l0"] == (20, 3)
        assert shapes["weight_ih_l1"] == (20, 10)
        assert shapes["bias_hh_l1_reverse"] == (20,)
        assert len(shapes) == 16
        assert len(list(nn.GRU(3, 5, bias=False).parameters())) == 2

    def test_input_errors(self) -> None:
        """Bad inputs raise at the call with the expected layout."""
        m = nn.LSTM(4, 5, num_layers=2)

        async def main() -> None:
            with pytest.raises(dataflow.OpInputError, match=r"x must have shape \(steps, batch"):
                await m(_rand(0, 3, 4))
            with pytest.raises(dataflow.OpTypeError, match="x has dtype float64"):
                await m(np.zeros((3, 2, 4)))
            with pytest.raises(dataflow.OpInputError, match=r"h0 must have shape .*\(2, 2, 5\)"):
                await m(_rand(0, 3, 2, 4), (_rand(0, 1, 2, 5), _rand(0, 2, 2, 5)))
            with pytest.raises(dataflow.OpInputError, match=r"hx must be a tuple \(h0, c0\)"):
                await m(_rand(0, 3, 2, 4), _rand(0, 2, 2, 5))
            with pytest.raises(dataflow.OpInputError, match=r"nn.LSTM: .* got h0 alone"):
                await m(_rand(0, 3, 2, 4), (_rand(0, 2, 2, 5), None))
            with pytest.raises(dataflow.OpInputError, match=r"nn.LSTM: .* got c0 alone"):
                await m(_rand(0, 3, 2, 4), (None, _rand(0, 2, 2, 5)))
            gru = nn.GRU(4, 5, num_layers=2)
            with pytest.raises(dataflow.OpInputError, match=r"a GRU's hx is h0 alone"):
                await gru(_rand(0, 3, 2, 4), (_rand(0, 2, 2, 5), _rand(1, 2, 2, 5)))
            layers = await gru(_rand(0, 3, 2, 4), [_rand(0, 2, 5), _rand(1, 2, 5)])  # still fine
            assert layers[1].shape == (2, 2, 5)
            with pytest.raises(dataflow.OpInputError, match=r"got tuple of 3 items"):
                await m(_rand(0, 3, 2, 4), (_rand(0, 2, 2, 5),) * 3)
            with pytest.raises(
                dataflow.OpInputError, match=r"x \(steps, batch, input_size\) has no"
            ):
                await m(_rand(0, 0, 2, 4))
            with pytest.raises(
                dataflow.OpInputError, match=r"has an empty batch, got float32\[3, 0"
            ):
                await m(_rand(0, 3, 0, 4))

        dataflow.run(main)

    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    def test_bad_input_types_name_the_module_and_argument(self, mode: str) -> None:
        """None, a string or an ndarray subclass as x or h0 is an OpTypeError naming the
        module and the argument (it was "got object[]", or "an argument is a ...")."""
        m = getattr(nn, mode)(4, 5)
        x, h = _rand(0, 3, 2, 4), _rand(0, 1, 2, 5)

        def hx(h0: Any) -> Any:
            return (h0, h) if mode == "LSTM" else h0

        async def main() -> None:
            for bad in (None, "abc"):
                with pytest.raises(dataflow.OpTypeError, match=rf"^nn.{mode}: x has type"):
                    await m(bad)
            with pytest.raises(dataflow.OpTypeError, match=rf"^nn.{mode}: h0 has type str"):
                await m(x, hx("abc"))
            with pytest.raises(dataflow.OpTypeError, match=rf"^nn.{mode}: x is a np\.ma\."):
                await m(np.ma.masked_array(x))
            with pytest.raises(dataflow.OpTypeError, match=rf"^nn.{mode}: h0 is a np\.ma\."):
                await m(x, hx(np.ma.masked_array(h)))

        dataflow.run(main)


class TestStateDict:
    """state_dict / load_state_dict round trips and torch compatibility."""

    def test_round_trip(self) -> None:
        """A second model loaded from the first's state dict gives the same output."""
        a = nn.GRU(4, 6, num_layers=2, bidirectional=True, seed=1)
        b = nn.GRU(4, 6, num_layers=2, bidirectional=True, seed=2)
        result = b.load_state_dict(a.state_dict())
        assert result.missing_keys == [] and result.unexpected_keys == []
        x = _rand(0, 3, 2, 4)

        async def main() -> tuple[Array, Array]:
            return (await a(x))[0], (await b(x))[0]

        ya, yb = dataflow.run(main)
        assert np.array_equal(ya, yb)

    def test_state_dict_is_a_copy(self) -> None:
        """Changing the returned arrays does not change the model."""
        m = nn.Linear(2, 2, seed=0)
        sd = m.state_dict()
        sd["weight"][:] = 0
        assert np.any(m.weight != 0)

    def test_load_copies(self) -> None:
        """Loaded arrays are copied in: later edits to the dict do not leak into the model."""
        m = nn.Linear(2, 2)
        sd = {"weight": np.ones((2, 2), np.float32), "bias": np.ones(2, np.float32)}
        m.load_state_dict(sd)
        sd["weight"][:] = 5
        assert np.all(m.weight == 1)

    def test_missing_and_unexpected_keys(self) -> None:
        """strict loading lists both kinds of key and changes nothing."""
        m = nn.LSTM(2, 3, seed=0)
        before = m.weight_ih_l0.copy()
        sd = m.state_dict()
        del sd["bias_hh_l0"]
        sd["weight_ih_l1"] = np.zeros((12, 3), np.float32)
        sd["weight_ih_l0"] = np.zeros((12, 2), np.float32)
        with pytest.raises(nn.StateDictError) as e:
            m.load_state_dict(sd)
        msg = str(e.value)
        assert "missing keys: bias_hh_l0" in msg
        assert "unexpected keys: weight_ih_l1" in msg
        assert "strict=False" in msg
        assert np.array_equal(m.weight_ih_l0, before)
        result = m.load_state_dict(sd, strict=False)
        assert result.missing_keys == ["bias_hh_l0"]
        assert result.unexpected_keys == ["weight_ih_l1"]
        assert np.all(m.weight_ih_l0 == 0)

    @pytest.mark.parametrize("strict", ["no", "False", 0, None], ids=repr)
    def test_strict_must_be_a_bool(self, strict: Any) -> None:
        """strict='no' is refused naming the argument, not read as strict."""
        m = nn.Linear(2, 2)
        with pytest.raises(dataflow.DataflowTypeError, match=r"load_state_dict: strict must"):
            m.load_state_dict({}, strict=strict)

    @pytest.mark.parametrize("sd", [None, [("weight", np.zeros((2, 2)))], "weight"], ids=repr)
    def test_state_dict_must_be_a_mapping(self, sd: Any) -> None:
        """load_state_dict(None) names the argument and what it expects."""
        m = nn.Linear(2, 2)
        with pytest.raises(TypeError, match=r"load_state_dict: state_dict must be a mapping"):
            m.load_state_dict(sd)

    def test_any_mapping_loads(self) -> None:
        """A read-only mapping (types.MappingProxyType) loads like a dict."""
        import types

        m, n = nn.Linear(2, 2, seed=0), nn.Linear(2, 2, seed=1)
        n.load_state_dict(types.MappingProxyType(m.state_dict()))
        assert np.array_equal(n.weight, m.weight)

    def test_shape_and_dtype_mismatch(self) -> None:
        """A wrong shape or dtype is an error even with strict=False."""
        m = nn.Linear(3, 2)
        with pytest.raises(nn.StateDictError, match=r"weight: the model has float32\[2, 3\], "):
            m.load_state_dict({"weight": np.zeros((3, 2), np.float32)}, strict=False)
        with pytest.raises(nn.StateDictError, match=r"bias: .* the state dict has float64\[2\]"):
            m.load_state_dict({"weight": m.weight, "bias": np.zeros(2)})
        assert isinstance(nn.StateDictError("x"), ValueError)

    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    def test_torch_weights_give_torch_outputs(self, mode: str) -> None:
        """A torch model's state dict, as numpy, reproduces its outputs within 1e-5."""
        torch = pytest.importorskip("torch")
        torch.manual_seed(0)
        tm = getattr(torch.nn, mode)(8, 16, num_layers=2, bidirectional=True, batch_first=True)
        m = getattr(nn, mode)(8, 16, num_layers=2, bidirectional=True, batch_first=True)
        m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
        x = _rand(4, 3, 7, 8)
        h0 = _rand(5, 4, 3, 16)
        c0 = _rand(6, 4, 3, 16)
        th, tc = torch.from_numpy(h0), torch.from_numpy(c0)
        with torch.no_grad():
            expected = tm(torch.from_numpy(x), (th, tc) if mode == "LSTM" else th)

        async def main() -> Any:
            return await m(x, (h0, c0) if mode == "LSTM" else h0)

        got = dataflow.run(main, interop_threads=2)
        assert _diff(got[0], expected[0].numpy()) <= TOL
        if mode == "LSTM":
            assert _diff(got[1][0], expected[1][0].numpy()) <= TOL
            assert _diff(got[1][1], expected[1][1].numpy()) <= TOL
        else:
            assert _diff(got[1], expected[1].numpy()) <= TOL

    class Shared(nn.Module):
        """``b`` is ``a`` (a shared submodule), as in ``self.b = self.a`` in torch."""

        def __init__(self) -> None:
            self.a = nn.Linear(2, 3, seed=0)
            self.b = self.a
            self.c = nn.Linear(3, 3, seed=1)

    def test_shared_submodule_is_in_the_state_dict_under_every_name(self) -> None:
        """As torch's state dict, a shared submodule's parameters appear under each name it
        has (so a torch model's state dict loads strictly); named_children lists it once."""
        net = self.Shared()
        names = ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"]
        assert list(net.state_dict()) == names
        assert [k for k, _ in net.named_children()] == ["a", "c"]
        assert [k for k, _ in net.named_parameters()] == [names[i] for i in (0, 1, 4, 5)]
        sd = {
            k: np.full(v.shape, i, np.float32) for i, (k, v) in enumerate(net.state_dict().items())
        }
        assert net.load_state_dict(sd) == ([], [])
        assert net.b is net.a and np.all(net.a.weight == 2)  # the later name's value, as torch
        assert "(b): Linear" in repr(net)

    def test_torch_model_with_a_shared_submodule_loads(self) -> None:
        """torch's state dict of a model with a shared submodule loads strictly."""
        torch = pytest.importorskip("torch")
        base: Any = torch.nn.Module

        class TShared(base):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.a = torch.nn.Linear(2, 3)
                self.b = self.a
                self.c = torch.nn.Linear(3, 3)

        sd = {k: v.detach().numpy() for k, v in TShared().state_dict().items()}
        net = self.Shared()
        assert list(net.state_dict()) == list(sd)
        net.load_state_dict(sd)
        assert np.array_equal(net.a.weight, sd["a.weight"])

    def test_tied_parameters_stay_tied_after_loading(self) -> None:
        """Two names for one array (weight tying) name one array after load_state_dict, as
        after torch's in-place load, also when the dict gives only one of the names."""

        class Tied(nn.Module):
            def __init__(self) -> None:
                self.enc = nn.Linear(4, 4, seed=0)
                self.dec = nn.Linear(4, 4, seed=1)
                self.dec.weight = self.enc.weight

        net = Tied()
        sd = {
            k: np.full(v.shape, i, np.float32) for i, (k, v) in enumerate(net.state_dict().items())
        }
        assert list(sd) == ["enc.weight", "enc.bias", "dec.weight", "dec.bias"]
        net.load_state_dict(sd)
        assert net.dec.weight is net.enc.weight and np.all(net.enc.weight == 2)  # the later
        assert len(list(net.parameters())) == 3
        net.load_state_dict({"enc.weight": np.ones((4, 4), np.float32)}, strict=False)
        assert net.dec.weight is net.enc.weight and np.all(net.dec.weight == 1)

    def test_torch_ensemble_names_match(self) -> None:
        """The tutorial's torch ensemble's state dict loads into the numpy Ensemble."""
        torch = pytest.importorskip("torch")

        base: Any = torch.nn.Module

        class TBi(base):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.cell_f = torch.nn.LSTM(4, 4)
                self.cell_b = torch.nn.LSTM(4, 4)

        class TEns(base):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.models = torch.nn.ModuleList([TBi() for _ in range(2)])

        sd = {k: v.detach().numpy() for k, v in TEns().state_dict().items()}
        ens = Ensemble(2, 4)
        assert list(sd) == list(ens.state_dict())
        ens.load_state_dict(sd)
        assert np.array_equal(ens.models[1].cell_b.weight_hh_l0, sd["models.1.cell_b.weight_hh_l0"])


class TestParallelism:
    """The decomposition exposes inter-op parallelism (shown by counters, not timings)."""

    def test_ensemble_runs_ops_side_by_side(self) -> None:
        """The tutorial ensemble, with no fork, keeps 2 pool threads busy at once."""
        ens = Ensemble(2, 128)
        x = np.random.default_rng(0).random((8, 8, 128), dtype=np.float32)

        async def main() -> tuple[Array, int]:
            y: Array = await ens(x)
            rt = dataflow.current_runtime()
            assert rt is not None
            return y, rt.peak_running

        y, peak = dataflow.run(main, interop_threads=2)
        assert peak >= 2
        expected = np.zeros((8, 8, 256))
        for bi in ens.models:
            out_f = ref_rnn("LSTM", bi.cell_f.state_dict(), x, None, None, 1, False, False)[0]
            out_b = ref_rnn("LSTM", bi.cell_b.state_dict(), x[::-1], None, None, 1, False, False)
            expected = expected + np.concatenate([out_f, out_b[0][::-1]], axis=2)
        assert _diff(y, expected) <= TOL

    @staticmethod
    def _run_recorded(m: nn.LSTM, x: Array, threads: int) -> tuple[Array, Recorder]:
        rec = Recorder()

        async def main() -> Array:
            out, _ = await m.forward(x)
            y: Array = await out
            return y

        dataflow.add_instrument(rec)
        try:
            y = dataflow.run(main, interop_threads=threads)
        finally:
            dataflow.remove_instrument(rec)
        return y, rec

    @staticmethod
    def _intervals(rec: Recorder, op: str) -> list[tuple[int, int]]:
        starts = {name: ts for ev, name, ts in rec.events if ev == "start"}
        return [
            (starts[name], ts)
            for ev, name, ts in rec.events
            if ev == "finish" and name.startswith(op + "#")
        ]

    def test_stacked_layers_form_a_wavefront(self) -> None:
        """Layer 1 steps start before layer 0 is done, and run alongside layer 0's steps."""
        # Steps big enough that the GEMM (which releases the GIL) dominates each kernel.
        steps = 12
        m = nn.LSTM(256, 256, num_layers=2, seed=0, granularity="step")
        x = np.random.default_rng(1).random((steps, 32, 256), dtype=np.float32)
        y, rec = self._run_recorded(m, x, threads=2)
        # Layer 0 runs as lstm_step ops (after one projection), layer 1 as fused lstm_cell ops.
        layer0 = self._intervals(rec, "lstm_step")
        layer1 = self._intervals(rec, "lstm_cell")
        assert len(layer0) == len(layer1) == steps
        assert min(s for s, _ in layer1) < max(f for _, f in layer0)
        assert any(s1 < f0 and s0 < f1 for s0, f0 in layer0 for s1, f1 in layer1)
        r_out = ref_rnn("LSTM", m.state_dict(), x, None, None, 2, False, False)[0]
        assert _diff(y, r_out) <= TOL

    def test_one_thread_runs_steps_one_at_a_time(self) -> None:
        """Control for the test above: with one inter-op thread no two steps overlap."""
        m = nn.LSTM(128, 128, num_layers=2, seed=0, granularity="step")
        x = np.random.default_rng(1).random((6, 8, 128), dtype=np.float32)
        _, rec = self._run_recorded(m, x, threads=1)
        layer0 = self._intervals(rec, "lstm_step")
        layer1 = self._intervals(rec, "lstm_cell")
        assert not any(s1 < f0 and s0 < f1 for s0, f0 in layer0 for s1, f1 in layer1)


class TestOneAwait:
    """One ``await`` of a module call (or a fork) gives arrays, except in model code."""

    def test_top_level_await_gives_arrays(self) -> None:
        """`await model(x)` in a program gives numpy arrays, nested outputs included."""
        m = nn.LSTM(4, 5, seed=0)

        async def main() -> Any:
            return await m(_rand(0, 3, 2, 4))

        out, (h_n, c_n) = dataflow.run(main)
        assert all(isinstance(a, np.ndarray) for a in (out, h_n, c_n))

    def test_inside_a_forward_submodules_give_pending_outputs(self) -> None:
        """A submodule called in a forward returns pending tensors (the members overlap)."""
        seen: list[type] = []

        class Outer(nn.Module):
            def __init__(self) -> None:
                self.inner = nn.Linear(3, 2, seed=0)

            async def forward(self, x: Any) -> Any:
                y = await self.inner(x)
                seen.append(type(y))
                return ops.tanh(y)

        async def main() -> Any:
            return await Outer()(np.ones((4, 3), np.float32))

        out = dataflow.run(main)
        assert seen == [ops.Tensor] and isinstance(out, np.ndarray)

    def test_forward_itself_always_gives_pending(self) -> None:
        """`await model.forward(x)` gives the pending outputs, at any level."""
        fc = nn.Linear(3, 2, seed=0)

        async def main() -> bool:
            return isinstance(await fc.forward(np.ones((1, 3), np.float32)), ops.Tensor)

        assert dataflow.run(main)

    def test_waiting_for_a_fork_gives_arrays(self) -> None:
        """wait(fork(fn)) of a function returning pending tensors gives arrays; in model
        code it gives the pending tensors."""

        async def chain(x: Any) -> Any:
            return ops.tanh(ops.asarray(x) * 2.0)

        async def main() -> tuple[type, type]:
            top = await dataflow.wait(dataflow.fork(chain, np.ones(3)))
            with dataflow.model_code():
                assert dataflow.in_model_code()
                inner = await dataflow.fork(chain, np.ones(3))
            assert not dataflow.in_model_code()
            return type(top), type(inner)

        assert dataflow.run(main) == (np.ndarray, ops.Tensor)

    def test_model_code_says_whether_it_was_nested_and_resets_on_error(self) -> None:
        """`with model_code() as nested`: False at the top, True inside another; the mark is
        taken off when the block ends, by an exception too."""
        assert not dataflow.in_model_code()
        with dataflow.model_code() as outer:
            with dataflow.model_code() as inner:
                assert dataflow.in_model_code()
            assert dataflow.in_model_code()
        assert (outer, inner) == (False, True)
        with pytest.raises(KeyError), dataflow.model_code():
            raise KeyError("x")
        assert not dataflow.in_model_code()

    def test_forks_started_in_model_code_are_model_code(self) -> None:
        """A coroutine forked from a forward inherits model code (its awaits stay pending)."""

        async def child() -> bool:
            return dataflow.in_model_code()

        class M(nn.Module):
            async def forward(self) -> Any:
                return await dataflow.fork(child)

        async def main() -> Any:
            return await M()()

        assert dataflow.run(main) is True
