"""An op call's arguments: the tasks of the pending handles among them, and their values.

Containers are walked as :mod:`dataflow._walk` says (lists, tuples, NamedTuples, dicts).
"""

from __future__ import annotations

from typing import Any

from ._task import DONE, LIGHT, Pending, Task
from ._walk import ATOMS, is_container, leaves, replace

__all__ = ["resolve", "resolve_kwargs", "scan"]


def _leaf_value(v: Any) -> Any:
    return v.result() if isinstance(v, Pending) else v


def resolve(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with every pending handle (also inside containers) replaced by its value."""
    out = []
    for a in args:
        if isinstance(a, Pending):
            out.append(a.result())
        elif is_container(a):
            out.append(replace(a, _leaf_value))
        else:
            out.append(a)
    return tuple(out)


def resolve_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: _leaf_value(v) if not is_container(v) else replace(v, _leaf_value)
            for k, v in kwargs.items()}  # fmt: skip


def scan(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> tuple[tuple[Task, ...], bool]:
    """The tasks of the pending handles in ``args``/``kwargs`` (containers walked), and
    whether all of them are done."""
    inputs: list[Task] = []
    for a in args if not kwargs else (*args, *kwargs.values()):
        if type(a) in ATOMS:
            continue
        if isinstance(a, Pending):
            inputs.append(a._t)
        elif is_container(a):
            inputs.extend(v._t for v in leaves(a) if isinstance(v, Pending))
    return tuple(inputs), all(t.state == DONE for t in inputs)


# -- the inputs' ids, for span records (only while something observes) -------------------------
#
# A light handle (see ``Pending``) points at its signature's shared done task, so ``inputs``
# (the tasks of the handles among an op's arguments) may hold that shared task where a
# record needs the handle's own id. These find the handles again among the arguments.


def own_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any] | None, inputs: tuple[Task, ...]
) -> tuple[Task, ...]:
    """``inputs`` with each light handle's shared task replaced by the handle's own (made now:
    ``Pending._task``), for a task record that instruments and recorders read."""
    for t in inputs:
        if t.value is LIGHT:
            break
    else:
        return inputs
    handles = [a for a in args if isinstance(a, Pending)]
    if len(handles) == len(inputs):  # no container or keyword held one: these, in order
        return tuple([h._task for h in handles])
    return tuple(
        [v._task for a in (args if not kwargs else (*args, *kwargs.values()))
         for v in leaves(a) if isinstance(v, Pending)]
    )  # fmt: skip


def record_ids(
    args: tuple[Any, ...], kwargs: dict[str, Any] | None, inputs: tuple[Task, ...]
) -> Any:
    """A span record's INPUTS field: the id of the one input task or a tuple of ids, a light
    handle's own id (``Pending._id``) standing for its shared task's."""
    if len(inputs) == 1:
        t = inputs[0]
        if t.value is not LIGHT:
            return t.id
        for a in args:  # the one handle is the first positional one, if any
            if isinstance(a, Pending):
                if a._t is t:
                    return _own_id(a)
                break
        return own_inputs(args, kwargs, inputs)[0].id
    for t in inputs:
        if t.value is LIGHT:
            break
    else:
        return tuple([t.id for t in inputs])
    handles = [a for a in args if isinstance(a, Pending)]
    if len(handles) == len(inputs):  # no container or keyword held one: these, in order
        return tuple([_own_id(h) for h in handles])
    return tuple([t.id for t in own_inputs(args, kwargs, inputs)])


def _own_id(handle: Pending[Any]) -> int:
    try:
        return handle._id  # a recorded light handle (no task made)
    except AttributeError:
        return handle._task.id
