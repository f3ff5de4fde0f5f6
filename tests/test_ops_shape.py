"""ops shape ops: reshape, transpose, flip, concatenate, stack, split, getitem and asarray."""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import OpInputError, OpTypeError
from tests._ops_helpers import assert_like, both, check, rand

# -- reshape / transpose / flip ----------------------------------------------------------------


class TestReshape:
    @pytest.mark.parametrize(
        "shape", [(4, 6), (24,), -1, (2, -1, 4), (1, 24, 1), [3, 8], (2, 3, 4)], ids=str
    )
    def test_matches_numpy(self, shape: Any) -> None:
        """reshape with tuples, lists, an int and one -1 equals np.reshape."""
        x = rand((2, 3, 4), np.float32, 1)
        check(lambda: ops.reshape(x, shape), np.reshape(x, shape))

    def test_zero_size(self) -> None:
        """A zero-size array reshapes to any zero-size shape."""
        x = np.empty((0, 4))
        check(lambda: ops.reshape(x, (2, 0, 2)), np.reshape(x, (2, 0, 2)))

    def test_method_forms(self) -> None:
        """t.reshape(2, -1) and t.reshape((2, -1)) both work."""
        x = rand((4, 3), np.int32, 2)
        check(lambda: ops.asarray(x).reshape(2, -1), x.reshape(2, -1))
        check(lambda: ops.asarray(x).reshape((3, 4)), x.reshape((3, 4)))

    def test_size_mismatch(self) -> None:
        """A shape of another size gives numpy's message with both shapes."""
        expected = (
            r"reshape: cannot reshape array of size 12 \(shape \(3, 4\)\) into shape \(5, 3\)"
        )
        with pytest.raises(OpInputError, match=expected):
            ops.reshape(np.ones((3, 4)), (5, 3))

    def test_two_unknowns(self) -> None:
        """At most one -1."""
        with pytest.raises(
            OpInputError, match=r"reshape: shape \(-1, -1\) may contain at most one"
        ):
            ops.reshape(np.ones(4), (-1, -1))

    def test_unknown_that_does_not_divide(self) -> None:
        """-1 must divide the size."""
        with pytest.raises(OpInputError, match=r"cannot reshape array of size 10"):
            ops.reshape(np.ones(10), (3, -1))

    def test_bad_shape_type(self) -> None:
        """A float in the shape is an OpTypeError."""
        with pytest.raises(OpTypeError, match=r"reshape: shape entries must be ints"):
            ops.reshape(np.ones(4), (2.0, 2))


class TestTranspose:
    @pytest.mark.parametrize("axes", [None, (0, 1, 2), (2, 0, 1), (-1, 0, 1), [1, 0, 2]], ids=str)
    def test_matches_numpy(self, axes: Any) -> None:
        """transpose with and without axes equals np.transpose."""
        x = rand((2, 3, 4), np.float64, 3)
        check(lambda: ops.transpose(x, axes), np.transpose(x, axes))

    def test_dot_t_and_method(self) -> None:
        """t.T reverses the axes; t.transpose(1, 0) permutes."""
        x = rand((3, 5), np.float32, 4)
        check(lambda: ops.asarray(x).T, x.T)
        check(lambda: ops.asarray(x).transpose(1, 0), x.transpose(1, 0))
        check(lambda: ops.asarray(x).transpose(), x.transpose())

    def test_not_a_permutation(self) -> None:
        """Repeated axes are refused."""
        with pytest.raises(OpInputError, match=r"transpose: axes \(0, 0\) are not a permutation"):
            ops.transpose(np.ones((2, 3)), (0, 0))

    def test_axis_out_of_range(self) -> None:
        """An axis past ndim is refused."""
        with pytest.raises(OpInputError, match=r"transpose: axis 2 is out of bounds"):
            ops.transpose(np.ones((2, 3)), (0, 2))


class TestFlip:
    @pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3, (0, 2), [0, 2], [-1]], ids=str)
    def test_matches_numpy(self, axis: Any) -> None:
        """flip along each axis form equals np.flip (one int axis: the kernel's own slice),
        by position and by keyword."""
        x = rand((3, 4, 2), np.int32, 5)
        check(lambda: ops.flip(x, axis), np.flip(x, axis))
        check(lambda: ops.flip(x, axis=axis), np.flip(x, axis))

    def test_one_axis_of_a_vector(self) -> None:
        x = rand((5,), np.float32, 6)
        check(lambda: ops.flip(x, 0), np.flip(x, 0))

    @pytest.mark.parametrize("axis", [0, -1, None, (0, 1)], ids=str)
    def test_nested_list_operand(self, axis: Any) -> None:
        """A nested list flips like its array (the one-axis slice once failed on a list)."""
        rows = rand((2, 3), np.float64, 7).tolist()
        check(lambda: ops.flip(rows, axis), np.flip(np.asarray(rows), axis))

    def test_bad_axis(self) -> None:
        """An axis past ndim is refused."""
        with pytest.raises(OpInputError, match=r"flip: axis 3 is out of bounds"):
            ops.flip(np.ones((2, 2)), 3)


# -- concatenate / stack / split ---------------------------------------------------------------


class TestConcatenate:
    @pytest.mark.parametrize("axis", [0, 1, -1, None], ids=str)
    def test_matches_numpy(self, axis: Any) -> None:
        """Tensors and arrays concatenate along any axis, or flattened with axis=None."""
        a, b = rand((2, 3), np.float32, 6), rand((2, 3), np.float32, 7)
        check(lambda: ops.concatenate([ops.exp(a), b], axis), np.concatenate([np.exp(a), b], axis))

    def test_uneven_lengths_and_tuple(self) -> None:
        """Arrays of different lengths along the axis; a tuple of arrays works too."""
        a, b, c = rand((1, 4), np.float64, 8), rand((3, 4), np.float64, 9), np.empty((0, 4))
        check(lambda: ops.concatenate((a, b, c)), np.concatenate((a, b, c)))

    def test_mixed_dtypes_promote(self) -> None:
        """float32 with int64 gives float64, like numpy."""
        a, b = rand((2,), np.float32, 10), rand((3,), np.int64, 11)
        check(lambda: ops.concatenate([a, b]), np.concatenate([a, b]))

    def test_mismatched_dimension(self) -> None:
        """A mismatch off the axis names the dimension, both sizes and both shapes."""
        expected = (
            r"concatenate: all dimensions except the concatenation axis 0 must match, but along "
            r"dimension 1 item 0 has size 3 and item 1 has size 4"
        )
        with pytest.raises(OpInputError, match=expected):
            ops.concatenate([np.ones((2, 3)), np.ones((2, 4))])

    def test_mismatched_ndim(self) -> None:
        """Arrays of different ndim are refused."""
        with pytest.raises(OpInputError, match=r"same number of dimensions"):
            ops.concatenate([np.ones((2, 3)), np.ones(3)])

    def test_empty_list_and_zero_d(self) -> None:
        """No arrays, or 0-d arrays, are refused."""
        with pytest.raises(OpInputError, match=r"concatenate: needs at least one array"):
            ops.concatenate([])
        with pytest.raises(OpInputError, match=r"0-d arrays cannot be concatenated"):
            ops.concatenate([np.float64(1.0), np.float64(2.0)])

    def test_not_a_list(self) -> None:
        """A single array instead of a list is an OpTypeError."""
        with pytest.raises(OpTypeError, match=r"concatenate: argument 1 must be a list or tuple"):
            ops.concatenate(np.ones((2, 2)))

    def test_bad_item_is_named(self) -> None:
        """A bad item is named by its index."""
        with pytest.raises(OpTypeError, match=r"concatenate: item 1 of argument 1 has type dict"):
            ops.concatenate([np.ones(2), {}])

    @pytest.mark.parametrize(
        ("array", "scalar"),
        [
            (rand((3,), np.float32, 12), 1.5),
            (rand((3,), np.int8, 13), 5),
            (rand((3,), np.int8, 14), True),
            (rand((3,), np.float16, 15), 2),
            (rand((3,), np.int32, 16), 2.5),
        ],
        ids=repr,
    )
    def test_python_scalars_are_weak(self, array: np.ndarray, scalar: Any) -> None:
        """A Python scalar item (axis=None) keeps the array's dtype where numpy's weak-scalar
        rule (NEP 50) does: [float32 array, 1.5] is float32."""
        check(
            lambda: ops.concatenate([array, scalar], axis=None),
            np.concatenate([array, scalar], axis=None),
        )

    def test_a_python_int_that_does_not_fit_is_refused_at_the_call(self) -> None:
        """numpy would wrap 1000 to -24 in an int8 result; ops refuses it, naming the item."""
        with pytest.raises(OpInputError, match=r"concatenate: Python integer 1000 \(item 1 of"):
            ops.concatenate([np.arange(3, dtype=np.int8), 1000], axis=None)


class TestStack:
    @pytest.mark.parametrize("axis", [0, 1, 2, -1], ids=str)
    def test_matches_numpy(self, axis: int) -> None:
        """stack along a new axis equals np.stack."""
        xs = [rand((3, 4), np.float32, s) for s in range(3)]
        check(lambda: ops.stack(xs, axis), np.stack(xs, axis))

    def test_zero_size_items(self) -> None:
        """Zero-size arrays stack to a zero-size result."""
        xs = [np.empty((0, 2)), np.empty((0, 2))]
        check(lambda: ops.stack(xs), np.stack(xs))

    def test_shape_mismatch(self) -> None:
        """Items of different shapes are named with their shapes."""
        expected = r"stack: all arrays must have the same shape, but item 0 has shape \(3,\) and "
        with pytest.raises(OpInputError, match=expected + r"item 1 has shape \(4,\)"):
            ops.stack([np.ones(3), np.ones(4)])

    def test_axis_out_of_range(self) -> None:
        """stack's axis may be ndim but not more."""
        with pytest.raises(OpInputError, match=r"stack: axis 3 is out of bounds .* dimension 3"):
            ops.stack([np.ones((2, 2))], axis=3)

    def test_python_scalar_items_are_not_weak(self) -> None:
        """np.stack converts each item to an array first: a Python float is float64 there."""
        check(lambda: ops.stack([np.float32(1.0), 2.5]), np.stack([np.float32(1.0), 2.5]))

    def test_the_seed_ensemble_reduction(self) -> None:
        """sum(stack(results), axis=0), as the reference ensemble does, equals numpy."""
        xs = [rand((5, 2, 8), np.float32, s) for s in range(4)]
        check(lambda: ops.sum(ops.stack(xs), axis=0), np.sum(np.stack(xs), axis=0))


class TestSplit:
    @pytest.mark.parametrize(
        ("ios", "axis"), [(2, 0), (3, 1), ([1, 3], 1), ([0, 10], 0), ([-2], 1), (1, 0)], ids=str
    )
    def test_matches_numpy(self, ios: Any, axis: int) -> None:
        """split into sections or at indices gives numpy's pieces, as a tuple of Tensors."""
        x = rand((4, 6), np.float64, 12)
        expected = np.split(x, ios, axis)
        for got in both(lambda: ops.split(x, ios, axis)):
            assert isinstance(got, tuple) and len(got) == len(expected)
            for g, e in zip(got, expected, strict=True):
                assert_like(g, e)

    @pytest.mark.parametrize(("ios", "axis"), [([1], 1), ([1], -1), ([], 1), (3, -1)], ids=str)
    def test_nested_list_operand_along_a_later_axis(self, ios: Any, axis: int) -> None:
        """A nested list splits like its array along any axis (np.split took a list's length
        as len(x) whatever the axis: pieces of other shapes than the meta rule declared)."""
        rows = rand((2, 3), np.float64, 14).tolist()
        expected = np.split(np.asarray(rows), ios, axis)
        for got in both(lambda: ops.split(rows, ios, axis)):
            assert len(got) == len(expected)
            for g, e in zip(got, expected, strict=True):
                assert_like(g, e)

    def test_a_0d_integer_array_is_a_number_of_sections(self) -> None:
        """As numpy takes it; each value its own outputs (the signature cache knows an array
        by its shape and dtype only, so the value is passed as an int)."""
        x = rand((6, 4), np.float64, 13)
        for sections in (2, 3):
            expected = np.split(x, np.array(sections))
            cut = np.array(sections)
            for got in both(functools.partial(ops.split, x, cut)):
                assert len(got) == len(expected)
                for g, e in zip(got, expected, strict=True):
                    assert_like(g, e)

    def test_pieces_are_pending_tensors_in_a_runtime(self) -> None:
        """Each piece is a Tensor with its own shape; awaiting one gives its array."""

        async def main() -> list[tuple[int, ...]]:
            pieces = ops.split(ops.exp(np.ones((6, 2))), 3)
            assert all(isinstance(p, ops.Tensor) for p in pieces)
            return [(await p).shape for p in pieces]

        assert dataflow.run(main, interop_threads=2) == [(2, 2)] * 3

    def test_unequal_division(self) -> None:
        """Sections that do not divide the axis are refused."""
        expected = r"split: array split does not result in an equal division: axis 0 of length 10"
        with pytest.raises(OpInputError, match=expected):
            ops.split(np.ones(10), 3)

    def test_zero_sections(self) -> None:
        """Zero sections are refused."""
        with pytest.raises(OpInputError, match=r"split: the number of sections must be > 0"):
            ops.split(np.ones(4), 0)

    def test_index_arrays_of_one_shape_give_their_own_pieces(self) -> None:
        """np.array([1, 3]) then np.array([2, 3]): each call's own shapes (not a cached one)."""
        x = np.arange(6.0)
        for cuts in (np.array([1, 3]), np.array([2, 3]), np.array([0, 5], np.int32)):
            expected = np.split(x, cuts)
            for got in both(functools.partial(ops.split, x, cuts)):
                for g, e in zip(got, expected, strict=True):
                    assert_like(g, e)

    def test_tensor_indices_refused(self) -> None:
        """Split points must be known: a Tensor is an OpTypeError."""
        with pytest.raises(OpTypeError, match=r"split: indices_or_sections must be an int"):
            ops.split(np.ones(4), ops.asarray(2))


# -- getitem -----------------------------------------------------------------------------------

X = rand((4, 5, 6), np.float32, 13)
INDICES: list[Any] = [
    0,
    -1,
    (1, 2),
    (1, 2, 3),
    slice(1, 3),
    (slice(None), slice(None, None, -2)),
    (Ellipsis, 1),
    (None, 0),
    (0, None, slice(1, 4), None),
    (slice(10, 20),),
    [0, 2],
    (slice(None), [1, 3, 4]),
    ([0, 1], [2, 3]),
    (0, slice(None), [1, 2]),
    ([[0], [2]], slice(None), [1, 2]),
    (Ellipsis, [5, 0]),
    (None, [0, 1], 1),
    (slice(None), []),
    np.array([3, 1]),
    (np.int64(2), np.array([[0, 4]])),
    X[:, 0, 0] > 0,
    (slice(None), np.ones((5, 6), bool)),
    (),
    Ellipsis,
    # An ellipsis for no axis parts the advanced items: their dimensions go first, as numpy's
    # (they went in place: the kernel returned (1, 4), the meta rule declared (4, 1)).
    (slice(None), [1], ..., 3),
    (slice(None), [1], ..., [3, 2]),
    # An empty broadcast index: numpy checks no index array's bounds (ops refused these).
    ([9], []),
    (np.zeros(4, bool), [9]),
]


class TestGetitem:
    @pytest.mark.parametrize("key", INDICES, ids=repr)
    def test_matches_numpy(self, key: Any) -> None:
        """Basic and advanced indexing give numpy's shape and values."""
        check(lambda: ops.asarray(X)[key], X[key])
        check(lambda: ops.getitem(X, key), X[key])

    @pytest.mark.parametrize(
        "key",
        [
            np.array(True),
            np.array(False),
            (Ellipsis, np.array(True)),
            (0, np.array(False)),
            (np.array(True), 1),
            (slice(None), np.array(True), 1),
        ],
        ids=repr,
    )
    def test_a_0d_boolean_mask(self, key: Any) -> None:
        """A 0-d boolean mask uses no axis: it adds one of length 1 (True) or 0 (False)."""
        x2 = X[0]
        check(lambda: ops.getitem(x2, key), x2[key])
        check(lambda: ops.getitem(np.array(2.5), np.array(True)), np.array(2.5)[np.array(True)])

    def test_index_tensor(self) -> None:
        """An integer Tensor (pending in a runtime) is an index array; alone, it takes
        getitem_rows (its values checked by numpy in the kernel: not known at the call)."""
        idx = np.array([2, 0, 3])
        check(lambda: ops.asarray(X)[ops.add(idx, 0)], X[idx])
        assert ops.asarray(X)[ops.asarray(idx)].task.sig.name == "getitem_rows"
        check(lambda: ops.asarray(X)[1, :, ops.asarray(idx)], X[1, :, idx])

    def test_index_of_pending_tensor(self) -> None:
        """Indexing the output of another op works before it ran."""
        check(lambda: ops.exp(X)[-1, 1:3], np.exp(X)[-1, 1:3])

    def test_iteration_yields_rows(self) -> None:
        """Iterating a Tensor yields t[0], t[1], ... and stops."""
        rows = list(ops.asarray(X[:, :, 0]))
        assert len(rows) == 4
        for r, e in zip(rows, X[:, :, 0], strict=True):
            assert_like(r.result(), e)

    def test_zero_d_tensor_cannot_iterate(self) -> None:
        """len() of a 0-d Tensor is a TypeError, like numpy."""
        with pytest.raises(TypeError, match="0-d"):
            list(ops.asarray(1.0))

    def test_out_of_bounds(self) -> None:
        """An int past the axis is refused with numpy's wording."""
        expected = r"getitem: index 4 is out of bounds for axis 0 with size 4"
        with pytest.raises(OpInputError, match=expected):
            ops.asarray(X)[4]

    def test_array_out_of_bounds(self) -> None:
        """A concrete index array is bounds-checked at the call."""
        with pytest.raises(OpInputError, match=r"index -7 is out of bounds for axis 1 with size 5"):
            ops.asarray(X)[:, [0, -7]]

    def test_too_many_indices(self) -> None:
        """More indices than axes are refused."""
        with pytest.raises(OpInputError, match=r"too many indices .* 3-dimensional, but 4"):
            ops.asarray(X)[0, 0, 0, 0]

    def test_two_ellipses(self) -> None:
        """A second Ellipsis is refused."""
        with pytest.raises(OpInputError, match=r"single ellipsis"):
            ops.asarray(X)[..., 0, ...]

    def test_index_arrays_that_do_not_broadcast(self) -> None:
        """Advanced indices must broadcast together."""
        expected = r"shape mismatch: the index arrays of shapes \(2,\) \(3,\)"
        with pytest.raises(OpInputError, match=expected):
            ops.asarray(X)[[0, 1], [0, 1, 2]]

    @pytest.mark.parametrize(
        "key",
        [
            4,
            (slice(None), [0, -7]),
            (0, 0, 0, 0),
            (..., 0, ...),
            ([0, 1], [0, 1, 2]),
            np.ones(3, bool),
        ],
        ids=["int", "array", "too-many", "two-ellipses", "no-broadcast", "mask"],
    )
    def test_refused_indices_are_index_errors_like_numpy(self, key: Any) -> None:
        """Where numpy raises IndexError, so does the op (an OpIndexError, still an
        OpInputError): they were OpInputErrors alone, ValueErrors, which `except IndexError`
        around indexing code written for numpy did not catch."""
        with pytest.raises(IndexError):
            X[key]
        with pytest.raises(dataflow.OpIndexError) as info:
            ops.asarray(X)[key]
        assert isinstance(info.value, OpInputError)

    def test_float_index(self) -> None:
        """A float index is an OpTypeError listing the valid kinds."""
        with pytest.raises(OpTypeError, match=r"index item 0 has type float: only ints, slices"):
            ops.asarray(X)[1.0]

    def test_boolean_mask_tensor_refused(self) -> None:
        """A bool Tensor mask has a data-dependent shape: refused with advice."""
        mask = ops.greater(X[:, 0, 0], 0)
        with pytest.raises(OpTypeError, match=r"boolean mask Tensor .* await the mask first"):
            ops.asarray(X)[mask]

    def test_mask_shape_mismatch(self) -> None:
        """A numpy mask must match the axes it covers."""
        with pytest.raises(OpInputError, match=r"boolean index of shape \(3,\) does not match"):
            ops.asarray(X)[np.ones(3, bool)]

    def test_slice_with_tensor_bound(self) -> None:
        """A slice bound must be an int, not a Tensor."""
        with pytest.raises(
            OpTypeError, match=r"slice bounds must be ints or None, got Tensor .*\(await the Tensor"
        ):
            ops.asarray(X)[: ops.asarray(2)]

    def test_index_tensor_out_of_range_fails_eagerly(self) -> None:
        """An index Tensor's bounds are checked by numpy in the kernel: a TaskError."""
        idx = ops.asarray(np.array([0, 9]))
        with pytest.raises(dataflow.TaskError, match=r"getitem_rows#\d+ failed: IndexError"):
            ops.asarray(X)[idx]

    def test_index_tensor_out_of_range_fails_in_a_runtime(self) -> None:
        """In a runtime the kernel's IndexError surfaces as a TaskError where it is awaited."""

        async def main() -> str:
            idx = ops.add(np.array([0, 9]), 0)
            y = ops.asarray(X)[idx]
            with pytest.raises(dataflow.TaskError, match=r"getitem_rows#\d+ failed: IndexError"):
                await y
            return "ok"

        assert dataflow.run(main, interop_threads=2) == "ok"

    def test_views_run_inline(self) -> None:
        """Basic indexing of a done Tensor is a free view: done at once even in a runtime."""

        async def main() -> bool:
            t = ops.asarray(X)
            done: bool = t[0, 1:3].done() and t.T.done() and t.reshape(-1).done()
            return done

        assert dataflow.run(main, interop_threads=2) is True

    def test_advanced_indexing_costs_bytes(self) -> None:
        """Advanced indexing copies: its cost counts the bytes it moves, a view costs nothing."""
        t = ops.asarray(X)
        assert t[0].task.cost == dataflow.Cost(0.0, 0.0)
        assert t[[0, 1]].task.cost == dataflow.Cost(0.0, 2.0 * 2 * 5 * 6 * 4)

    def test_a_basic_index_is_worked_out_once(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``t[i]`` in a loop: the op's signature cache (and, for slices, which Python 3.11
        cannot hash, a memo) keeps the shape, so the index is worked out once per shape and
        index (it cost 10 us a call, 5x another op's dispatch)."""
        from ops import _indexing

        calls: list[Any] = []
        real = _indexing.index_spec

        def counted(shape: Any, key: Any) -> Any:
            calls.append(key)
            return real(shape, key)

        monkeypatch.setattr(_indexing, "index_spec", counted)
        t = ops.asarray(X[:, :, :5] + 0)  # a shape of its own: nothing cached yet
        for _ in range(3):
            assert_like(t[2].result(), X[2, :, :5])
            assert_like(t[1:3, ..., None].result(), X[1:3, :, :5, None])
        assert len(calls) == 2

    def test_a_cached_slice_does_not_pass_a_float_bound(self) -> None:
        """The memo keys slices by int bounds: a float bound is still refused at the call."""
        t = ops.asarray(X)
        assert_like(t[1:3].result(), X[1:3])
        with pytest.raises(OpTypeError, match=r"slice bounds must be ints or None, got float"):
            t[1.0:3]

    @pytest.mark.parametrize(
        "idx",
        [
            np.array([3, 0, 3, -1]),
            np.array([[1, 2], [-4, 0]], dtype=np.int32),
            np.array([2, 1], dtype=np.uint8),
            np.array(2),
            np.array([], dtype=np.int64),
            np.zeros((0, 3), dtype=np.int64),
        ],
        ids=repr,
    )
    def test_one_integer_array_picks_rows(self, idx: Any) -> None:
        """``t[idx]`` with one integer array (an embedding's lookup) is numpy's, on random
        data, eagerly, in a runtime and on a pending Tensor; the meta rule runs once per
        shape, not at every call (the index was parsed at every call: 20.7 us a lookup)."""
        rng = np.random.default_rng(7)
        e = rng.standard_normal((4, 3, 2)).astype(np.float32)
        check(lambda: ops.asarray(e)[idx], e[idx])
        check(lambda: ops.getitem(e, idx), e[idx])
        check(lambda: ops.negative(e)[idx], (-e)[idx])
        assert ops.asarray(e)[idx].task.sig.name == "getitem_rows"

    @pytest.mark.parametrize("key", [[0, 2], [-1, 1, 1], [3], [1, True]], ids=repr)
    def test_a_list_of_ints_picks_rows_too(self, key: Any) -> None:
        """``t[[0, 2]]``: numpy reads a flat list of ints as one index array; so does the
        lean path (lists of bools, of lists or empty ones take the general one)."""
        check(lambda: ops.asarray(X)[key], X[key])
        assert ops.asarray(X)[key].task.sig.name == "getitem_rows"
        for other in ([True, False, True, False], [[0, 1]], []):
            check(lambda: ops.asarray(X)[other], X[other])  # noqa: B023
            assert ops.asarray(X)[other].task.sig.name == "getitem"

    def test_one_integer_array_out_of_bounds_is_refused_at_the_call(self) -> None:
        """Its bounds are still checked at every call, with getitem's own message."""
        t = ops.asarray(X)
        assert_like(t[np.array([0, 3])].result(), X[[0, 3]])
        for bad, said in ((4, "index 4"), (-5, "index -5")):
            with pytest.raises(dataflow.OpIndexError, match=f"getitem: {said} is out of bounds "
                               "for axis 0 with size 4"):  # fmt: skip
                t[np.array([0, bad])]
        empty = np.array([], dtype=np.int64)
        assert_like(ops.asarray(X[:0])[empty].result(), X[:0][empty])  # (numpy: no check)
        with pytest.raises(dataflow.OpIndexError, match="too many indices"):
            ops.asarray(np.float32(1.0))[np.array([0])]

    def test_the_four_argument_form_still_runs(self) -> None:
        """Graphs saved before a basic index was the op's own arguments give getitem its
        spec and cost too: that form still runs."""
        from ops._indexing import _getitem

        spec = ops.TensorSpec((5, 6), X.dtype)
        assert_like(_getitem(X, (0,), spec, dataflow.Cost(0.0, 0.0)).result(), X[0])


# -- asarray / astype --------------------------------------------------------------------------


class TestAsarray:
    @pytest.mark.parametrize(
        "value", [X, 3.5, 7, True, [[1, 2], [3, 4]], np.float32(2.0), []], ids=repr
    )
    def test_matches_numpy(self, value: Any) -> None:
        """asarray of arrays, scalars and lists equals np.asarray, as a done Tensor."""
        t = ops.asarray(value)
        assert t.done()
        assert_like(t.result(), np.asarray(value))

    def test_dtype_conversion(self) -> None:
        """dtype= converts like np.asarray(x, dtype)."""
        assert_like(ops.asarray([1.7, -2.2], dtype=np.int32).result(), np.array([1, -2], np.int32))
        assert_like(ops.asarray(X, np.float64).result(), X.astype(np.float64))

    def test_tensor_passes_through(self) -> None:
        """A Tensor of the same dtype is returned as is; another dtype is an astype op."""
        t = ops.asarray(X)
        assert ops.asarray(t) is t
        assert ops.asarray(t, np.float32) is t
        check(lambda: ops.asarray(ops.exp(X), np.float16), np.exp(X).astype(np.float16))
        check(lambda: ops.exp(X).astype(np.int32), np.exp(X).astype(np.int32))

    @pytest.mark.filterwarnings("error::RuntimeWarning")
    def test_astype_gives_numpys_values_under_warnings_as_errors(self) -> None:
        """NaN to int and overflow to float16 warn in numpy; under ``-W error`` the op still
        gives numpy's values (its kernel is quiet, as the other ops' are)."""
        values = np.array([np.nan, 1e10, -3.7])
        with np.errstate(all="ignore"):
            to_int, to_half = values.astype(np.int32), values.astype(np.float16)
        check(lambda: ops.astype(values, np.int32), to_int)
        check(lambda: ops.asarray(ops.add(values, 0.0), np.float16), to_half)

    @pytest.mark.filterwarnings("error::RuntimeWarning")
    def test_asarray_gives_numpys_values_under_warnings_as_errors(self) -> None:
        """asarray of an array or list to another dtype is quiet too, as astype is: NaN to
        int and overflow to float32 give numpy's values, not a RuntimeWarning at the call."""
        values = np.array([np.nan, 1e300, -3.7])
        with np.errstate(all="ignore"):
            to_int, to_single = values.astype(np.int32), values.astype(np.float32)
        assert_like(ops.asarray(values, np.int32).result(), to_int)
        assert_like(ops.asarray(values.tolist(), np.float32).result(), to_single)

    @pytest.mark.parametrize(("value", "dtype"), [(1j, np.uint64), ([1j, 2.0], np.float64)])
    def test_complex_to_real_is_an_op_type_error(self, value: Any, dtype: Any) -> None:
        """A Python complex that no real dtype holds: an OpTypeError naming asarray (it was
        numpy's bare TypeError)."""
        with pytest.raises(OpTypeError, match=r"asarray: cannot convert .*j.* to (uint64|float64)"):
            ops.asarray(value, dtype)

    def test_python_int_past_uint64(self) -> None:
        """asarray(2**70) was a Tensor of dtype object; refused at the call now. With a
        dtype that holds it, it converts; 2**63 is numpy's uint64."""
        with pytest.raises(OpInputError, match=r"asarray: Python integer \d+ .*uint64"):
            ops.asarray(2**70)
        with pytest.raises(OpInputError, match=r"astype: Python integer \d+ .*uint64"):
            ops.astype(2**70, np.float64)
        assert_like(ops.asarray(2**70, np.float64).result(), np.asarray(2.0**70))
        assert_like(ops.asarray(2**63).result(), np.asarray(2**63))

    def test_done_in_a_runtime(self) -> None:
        """In a runtime asarray is done at once (it has nothing to wait for)."""

        async def main() -> bool:
            done: bool = ops.asarray(np.ones(3)).done()
            return done

        assert dataflow.run(main, interop_threads=2) is True

    def test_bad_values(self) -> None:
        """dicts, None, strings, non-numeric dtypes and pending Tensors in lists are refused."""
        with pytest.raises(OpTypeError, match=r"asarray: argument 1 has type dict"):
            ops.asarray({})
        with pytest.raises(OpTypeError, match=r"asarray: argument 1 has type NoneType"):
            ops.asarray(None)
        with pytest.raises(OpTypeError, match=r"asarray: argument 1 has dtype <U2"):
            ops.asarray(["ab"])
        with pytest.raises(OpTypeError, match=r"asarray: dtype <U3 is not numeric"):
            ops.asarray([1.0], dtype="U3")
        with pytest.raises(OpTypeError, match=r"asarray: 'nonsense' is not a numpy dtype"):
            ops.asarray([1.0], dtype="nonsense")
        with pytest.raises(OpInputError, match=r"asarray: cannot convert 1000 to int8"):
            ops.asarray(1000, dtype=np.int8)

    def test_list_of_pending_tensors(self) -> None:
        """A list holding pending Tensors points to stack."""

        async def main() -> str:
            gate = threading.Event()
            t = _blocked(gate)
            try:
                with pytest.raises(OpTypeError, match=r"holding pending Tensors.*ops\.stack"):
                    ops.asarray([t, t])
            finally:
                gate.set()
            await t
            return "ok"

        assert dataflow.run(main, interop_threads=2) == "ok"


def _wait_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return x


_wait_op = ops.define(
    "wait_for_gate",
    _wait_kernel,
    meta=lambda x, gate: ops.spec_of(x),
    cost=lambda x, gate: dataflow.Cost(1e12, 0),
    inline=False,  # it blocks: never on the event loop, whatever time it was measured at
)


def _blocked(gate: threading.Event) -> Any:
    """A Tensor that stays pending until ``gate`` is set."""
    return _wait_op(np.ones(2), gate)
