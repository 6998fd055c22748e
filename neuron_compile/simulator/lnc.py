"""The two programs of an LNC2 launch (``kernel[2]``) as two threads that can meet: ``nisa.core_barrier`` and
``nisa.sendrecv``.

Both cores of a logical NeuronCore share HBM; a kernel that exchanges a tile with ``sendrecv`` or waits for the
peer's HBM writes with ``core_barrier`` needs the other program running at the same time, so :func:`run_programs`
runs such a launch as two threads, as AWS's simulator does (each with its own :class:`SimState`, stacked per
thread). Kernels that never synchronise keep running one program after the other (``kernel.run``).

:class:`Rendezvous` pairs the synchronising instructions by program order (AWS documents sendrecv that way: the
Nth one of a core meets the Nth one of its peer): the n-th ``core_barrier``/``sendrecv`` of program 0 meets the
n-th of program 1, and a barrier meeting a sendrecv is an error. Two waiting programs always meet, so the only way
to hang is a peer that never arrives: one that finished or failed (reported at once) or one stuck elsewhere
(reported after :data:`WAIT_S` seconds). ``shared_hbm`` allocations pair up the same way: the i-th allocation of
either program is one storage (what ``shared_replay`` does for the sequential path).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorError
from neuron_compile.simulator import state as _state
from neuron_compile.simulator import trace as _trace

log = logging.getLogger(__name__)

# Longest wait (seconds) for the peer program at a core_barrier / sendrecv before the launch is declared stuck. A
# peer that finished or raised is reported immediately; this only bounds a peer busy elsewhere, so it is generous
# (one program of a large kernel can run minutes ahead of the other on a loaded machine).
WAIT_S = 600.0
_SYNC_NAMES = frozenset({"core_barrier", "sendrecv"})
# Answers of synchronises() per kernel function: a runner launches the same kernel on every call.
_SYNCHRONISES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def synchronises(fn: Callable[..., Any]) -> bool:
    """Whether the kernel's code (its nested functions, and functions it names at module level) names
    ``core_barrier`` or ``sendrecv``: then its LNC2 launch runs as two threads. Remembered per function."""
    try:
        return _SYNCHRONISES[fn]
    except (KeyError, TypeError):
        pass
    found = _names_sync(fn)
    try:
        _SYNCHRONISES[fn] = found
    except TypeError:  # not weak-referenceable (a builtin or a callable object): asked again next time
        pass
    return found


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """Directories whose functions are never kernel code (the standard library, NumPy, this package, torch): the
    scan of a kernel's callees does not enter them (kernels loaded from source text carry this package's module
    name, so the test is on the code's file)."""
    import sysconfig

    import numpy

    dirs = [sysconfig.get_paths()["stdlib"], os.path.dirname(numpy.__file__),
            os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        dirs.append(os.path.dirname(torch.__file__))
    return tuple(os.path.join(d, "") for d in dirs)


def _kernel_function(g: Any) -> types.FunctionType | None:
    inner = getattr(g, "fn", g)  # an nki.jit Kernel wraps its function
    if not isinstance(inner, types.FunctionType):
        return None
    return None if inner.__code__.co_filename.startswith(_library_dirs()) else inner


def _names_sync(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s code, its nested functions or any function it calls by name (in its own module or another
    one, directly, as ``module.function`` or held in a closure) names a synchronising instruction."""
    seen: set[int] = set()
    todo: list[tuple[Any, dict[str, Any]]] = []

    def follow(f: types.FunctionType) -> None:
        todo.append((f.__code__, f.__globals__))
        for cell in f.__closure__ or ():  # functions a wrapper holds in a closure
            try:
                inner = _kernel_function(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
            if inner is not None:
                todo.append((inner.__code__, inner.__globals__))

    top = getattr(fn, "fn", fn)
    if isinstance(top, types.FunctionType):
        follow(top)
    while todo:
        code, glb = todo.pop()
        if not isinstance(code, types.CodeType) or id(code) in seen:
            continue
        seen.add(id(code))
        if _SYNC_NAMES & set(code.co_names):
            return True
        todo.extend((c, glb) for c in code.co_consts if isinstance(c, types.CodeType))
        for name in code.co_names:
            g = glb.get(name)
            targets = [g]
            if isinstance(g, types.ModuleType):  # module.function: the attribute names are co_names too
                # read the module's dict: a name the code never reaches must not warn or raise (nki.collectives)
                targets = [vars(g).get(a) for a in code.co_names]
            for t in targets:
                inner = _kernel_function(t)
                if inner is not None:
                    follow(inner)
    return False


class Rendezvous:
    """Meeting points of the programs of one launch: synchronising instructions in program order, shared HBM."""

    def __init__(self, programs: int) -> None:
        self.programs = programs
        self.cond = threading.Condition()
        self.arrivals: list[list[tuple[str, Any]]] = [[] for _ in range(programs)]
        self.done: list[str | None] = [None] * programs  # "finished" / "failed: ..." once a program stops
        self.shared: list[Any] = []  # shared_hbm storages, in allocation order
        self.reported: set[int] = set()  # programs whose error only reports the peer's

    def meet(self, pid: int, kind: str, payload: Any, peer: int) -> Any:
        """Post the ``kind`` instruction of program ``pid`` and wait for the same-numbered one of ``peer``; its
        payload."""
        with self.cond:
            n = len(self.arrivals[pid])
            self.arrivals[pid].append((kind, payload))
            self.cond.notify_all()
            deadline = time.monotonic() + WAIT_S
            while len(self.arrivals[peer]) <= n:
                if self.done[peer] is not None:
                    if self.done[peer] != "finished":
                        self.reported.add(pid)
                    raise SimulatorError(
                        f"nisa.{kind}: program {pid} of the LNC2 launch waits at its synchronising instruction #{n + 1}"
                        f" (core_barrier/sendrecv, counted in program order) but program {peer} {self.done[peer]} "
                        f"after only {len(self.arrivals[peer])}: both cores must execute the same core_barrier and "
                        "sendrecv instructions in the same order (keep them out of branches on nl.program_id)")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SimulatorError(
                        f"nisa.{kind}: program {pid} of the LNC2 launch waited {WAIT_S:g} s at its synchronising "
                        f"instruction #{n + 1} for program {peer}, which is still running but has reached only "
                        f"{len(self.arrivals[peer])}: a deadlock (the peer never gets there) or a peer far behind")
                self.cond.wait(min(left, 1.0))
            other_kind, other = self.arrivals[peer][n]
        if other_kind != kind:
            raise SimulatorError(
                f"nisa.{kind}: instruction #{n + 1} of program {pid} is a {kind} but #{n + 1} of program {peer} is a "
                f"{other_kind}: both cores must execute the same core_barrier and sendrecv instructions in the same "
                "order")
        return other

    def finish(self, pid: int, how: str) -> None:
        with self.cond:
            self.done[pid] = how
            self.cond.notify_all()

    def shared_storage(self, index: int, make: Callable[[], Any], matches: Callable[[Any], bool]) -> Any:
        """The ``index``-th shared_hbm allocation of a program: the peer's storage when it made it first (same shape
        and dtype), else a new one from ``make``."""
        with self.cond:
            if index < len(self.shared):
                prev = self.shared[index]
                return prev if matches(prev) else make()
            st = make()
            self.shared.append(st)
            return st


def current_peer() -> tuple[Rendezvous, int, int] | None:
    """(rendezvous, this program, its peer) inside a threaded LNC2 launch, else None."""
    st = _state.current()
    rv = st.peers
    if not isinstance(rv, Rendezvous):
        return None
    pid = st.program_id[0]
    return rv, pid, 1 - pid


def run_programs(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], grid: tuple[int, ...],
                 strict_capacity: bool, check_capacity: Callable[[str], None]) -> Any:
    """Run the two programs of an LNC2 launch as threads; program 0's return value. The first real error (not a
    peer's report of it) is re-raised in the caller's thread; an active instruction trace gets program 0's records,
    then program 1's (the order of the sequential path)."""
    rv = Rendezvous(2)
    results: list[Any] = [None, None]
    errors: list[BaseException | None] = [None, None]
    traces: list[_trace.Trace | None] = [None, None]
    name = getattr(fn, "__name__", "kernel")

    def program(pid: int) -> None:
        st = _state.SimState(program_id=(pid,), grid=grid, strict_capacity=strict_capacity)
        st.peers = rv
        if _trace.ACTIVE is not None:
            traces[pid] = _trace.Trace()
            _trace.set_thread_trace(traces[pid])
        _state.push(st)
        try:
            with np.errstate(all="ignore"):  # IEEE results, no host warnings (see kernel.run)
                results[pid] = fn(*args, **kwargs)
            check_capacity(name)
            rv.finish(pid, "finished")
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            errors[pid] = exc
            rv.finish(pid, f"failed ({type(exc).__name__})")
        finally:
            _state.pop(st)
            _trace.set_thread_trace(None)

    threads = [threading.Thread(target=program, args=(pid,), name=f"{name}[program {pid}]") for pid in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if _trace.ACTIVE is not None:
        for t in traces:
            if t is not None:
                _trace.ACTIVE.records.extend(t.records)
    # the first real error; a program's report that its peer failed is only a consequence
    failed = [e for pid, e in enumerate(errors) if e is not None and pid not in rv.reported]
    failed += [e for e in errors if e is not None]
    if failed:
        raise failed[0]
    return results[0]
