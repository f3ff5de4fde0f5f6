"""The recurrent kernels' scratch buffers (``ops._rnn_buffers._scratch``): temporaries kept by
each thread between calls, never handed out, and no pages faulted in again per call."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pytest

from ops import _rnn_buffers, _rnn_sequence

Array = np.ndarray


def _direction(seed: int, gates: int, steps: int, batch: int, size: int) -> tuple[Array, ...]:
    """Random input, weights and two biases of one direction with ``gates`` gates."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps, batch, size)).astype(np.float32)
    w_ih, w_hh = ((rng.standard_normal((gates * size, size)) / size**0.5).astype(np.float32)
                  for _ in range(2))  # fmt: skip
    b_ih, b_hh = (rng.standard_normal(gates * size).astype(np.float32) for _ in range(2))
    return x, w_ih, w_hh, b_ih, b_hh


def _lstm_args(seed: int, steps: int, batch: int, size: int) -> tuple[Array, ...]:
    x, w_ih, w_hh, bias, _ = _direction(seed, 4, steps, batch, size)
    return x, w_ih, bias, w_hh


def _gru_args(seed: int, steps: int, batch: int, size: int) -> tuple[Array, ...]:
    x, w_ih, w_hh, b_ih, b_hh = _direction(seed, 3, steps, batch, size)
    return x, w_ih, b_ih, w_hh, b_hh


def _lstm(args: tuple[Array, ...], reverse: bool = False) -> Any:
    x, w_ih, bias, w_hh = args
    return _rnn_sequence.lstm_sequence_kernel(x, w_ih, bias, w_hh, None, None, reverse, False)


def _gru(args: tuple[Array, ...]) -> Any:
    x, w_ih, b_ih, w_hh, b_hh = args
    return _rnn_sequence.gru_sequence_kernel(x, w_ih, b_ih, w_hh, b_hh, None, False, False)


# Sizes that take each kernel form: the small one (few weights a step), and the general one
# at a batch where the transposed form may be measured faster (both forms are exact).
SIZES = [(12, 1, 16), (6, 3, 128), (5, 8, 256)]


class TestScratch:
    def test_a_thread_gets_its_buffer_back_and_another_thread_its_own(self) -> None:
        a = _rnn_buffers._scratch("test", (3, 4), np.dtype(np.float32))
        assert _rnn_buffers._scratch("test", (3, 4), np.dtype(np.float32)) is a
        assert _rnn_buffers._scratch("test", (3, 5), np.dtype(np.float32)) is not a
        assert _rnn_buffers._scratch("test", (3, 4), np.dtype(np.float64)) is not a
        other: list[Array] = []
        t = threading.Thread(
            target=lambda: other.append(_rnn_buffers._scratch("test", (3, 4), np.dtype(np.float32)))
        )
        t.start()
        t.join()
        assert other[0] is not a

    def test_a_buffer_over_the_size_limit_is_not_kept(self) -> None:
        """Big temporaries (a long chunk's projection) are allocated per call: kept, they
        would stay beside the outputs until the pool closes."""
        n = _rnn_buffers.SCRATCH_BYTES_MAX // 4 + 1
        a = _rnn_buffers._scratch("big", (n,), np.dtype(np.float32))
        assert a.shape == (n,)
        assert _rnn_buffers._scratch("big", (n,), np.dtype(np.float32)) is not a
        small = _rnn_buffers._scratch("big", (n - 1,), np.dtype(np.float32))
        assert _rnn_buffers._scratch("big", (n - 1,), np.dtype(np.float32)) is small

    def test_a_thread_keeps_a_bounded_number(self) -> None:
        for n in range(3 * _rnn_buffers.SCRATCH_MAX):
            _rnn_buffers._scratch("bounded", (n + 1,), np.dtype(np.float32))
        assert len(_rnn_buffers._scratch_local.buffers) <= _rnn_buffers.SCRATCH_MAX

    @pytest.mark.parametrize("size", SIZES, ids=str)
    def test_results_never_share_memory_with_a_later_call(self, size: tuple[int, int, int]) -> None:
        """Outputs are fresh arrays: the next call (other data, same shapes, so the same
        scratch buffers) leaves the first call's results as they were."""
        first = _lstm(_lstm_args(1, *size))
        kept = [np.array(a) for a in first]
        second = _lstm(_lstm_args(2, *size), reverse=True)
        for a, b in zip(first, kept, strict=True):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(first, second, strict=True):
            assert not np.shares_memory(a, b)
        g1 = _gru(_gru_args(3, *size))
        g_kept = [np.array(a) for a in g1]
        _gru(_gru_args(4, *size))
        for a, b in zip(g1, g_kept, strict=True):
            np.testing.assert_array_equal(a, b)

    @pytest.mark.parametrize("size", SIZES, ids=str)
    def test_threads_side_by_side_match_one_thread(self, size: tuple[int, int, int]) -> None:
        """Each thread writes its own temporaries: eight directions on four threads at once
        give the results one thread gives them."""
        args = [_lstm_args(10 + i, *size) for i in range(8)]
        alone = [_lstm(a) for a in args]
        results: list[Any] = [None] * len(args)
        barrier = threading.Barrier(4)

        def work(k: int) -> None:
            barrier.wait()
            for _ in range(3):
                for i in range(k, len(args), 4):
                    results[i] = _lstm(args[i])

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for got, want in zip(results, alone, strict=True):
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's malloc tunables and minor faults"
)
def test_repeated_calls_fault_no_pages_in() -> None:
    """The point of the scratch buffers, with glibc's malloc forced to map every block of
    64 KiB or more on its own (as it does in some processes of a real run): a small LSTM
    direction faulted its ~130 pages of temporaries in again at every call (a GRU's ~100);
    now only their outputs' (a few pages) do."""
    code = textwrap.dedent(
        """
        import resource
        import numpy as np
        from ops import _rnn_engine
        from ops import _rnn_sequence
        from ops import _rnn_projection as P
        _rnn_engine.set_recurrent_engine("numpy")  # (the numpy kernels' scratch buffers)
        P._projection_form = lambda *a: 16  # the form with a buffer of its own: the most kept
        rng = np.random.default_rng(0)
        x = rng.standard_normal((50, 1, 128)).astype(np.float32)
        w_ih = (rng.standard_normal((512, 128)) / 128**0.5).astype(np.float32)
        w_hh = (rng.standard_normal((512, 128)) / 128**0.5).astype(np.float32)
        b = np.zeros(512, np.float32)
        g_ih, g_hh, gb = w_ih[:384], w_hh[:384], b[:384]
        def both():
            _rnn_sequence.lstm_sequence_kernel(x, w_ih, b, w_hh, None, None, False, False)
            _rnn_sequence.gru_sequence_kernel(x, g_ih, gb, g_hh, gb, None, False, False)
        for _ in range(3):
            both()
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            both()
        print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 20)
        """
    )
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True
    )
    faults = float(out.stdout.strip().splitlines()[-1])
    assert faults < 60, faults


@pytest.mark.parametrize("size", SIZES, ids=str)
def test_an_input_that_is_not_contiguous_is_copied_into_scratch_rows(
    size: tuple[int, int, int],
) -> None:
    """A time-flipped view (as a bidirectional module passes) or a batch-first transpose is
    copied into a scratch buffer for the projection: the same results as a contiguous copy."""
    x, w_ih, bias, w_hh = _lstm_args(7, *size)
    flipped = x[::-1]
    assert not flipped.flags.c_contiguous
    got = _lstm((flipped, w_ih, bias, w_hh))
    want = _lstm((np.ascontiguousarray(flipped), w_ih, bias, w_hh))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    bf = np.ascontiguousarray(x.swapaxes(0, 1)).swapaxes(0, 1)  # (T, B, I) view, B-major
    assert not bf.flags.c_contiguous or size[1] == 1  # (a batch of 1 is contiguous either way)
    got = _lstm((bf, w_ih, bias, w_hh))
    want = _lstm((x, w_ih, bias, w_hh))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
