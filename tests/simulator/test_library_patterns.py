"""Patterns AWS's own NKI kernels (nki-library, the MX tutorial) use, run on the simulator from source text.

Each was found by running those kernels here, and each test is written from the documented semantics:
* ``float4_e2m1fn_x4`` is four 4-bit codes in 16 bits (the MX tutorial packs two fp4 values per byte, low nibble
  first), so a ``uint16`` tensor viewed as fp4 x4 keeps its element count;
* ``.ap(scalar_offset=..., indirect_dim=k)`` moves the start by whole slices of the tensor ``ap`` is called on
  (``offset + idx * prod(shape[k + 1:])``), which may be a reshape of its storage;
* a DMA whose runtime (scalar_offset) address leaves its tensor skips the rows outside with
  ``oob_mode=nisa.oob_mode.skip`` and raises without it;
* a ``@dataclass`` ``nl.NKIObject`` subclass whose fields carry no annotations takes keyword arguments;
* ``vector_offset`` indices count the rows of the tensor ``ap`` is called on;
* an access pattern past its tensor is only an error once an instruction uses it;
* kernel arguments are shared HBM (both programs of an LNC2 launch see them), and a launch whose code reaches a
  core_barrier through a function of another module or a closure runs its programs together; a tensor is true as
  an object;
* ``scalar_tensor_tensor`` takes its ``(P, 1)`` operand0 in any dtype (nki-library's moe_cte scales by a bf16
  expert affinity), while ``tensor_scalar`` keeps requiring fp32 vector operands;
* a plain ``nl.NKIObject`` subclass may leave annotated fields out of its constructor call and assign them later;
* a stride-0 (broadcast) view of a PSUM tile counts the elements it touches, not its repeats, against the 4K-element
  limit of one PSUM access (nki-library's layernorm_tkg).
"""

from __future__ import annotations

import numpy as np
import pytest

from neuron_compile.errors import SimulatorError
from neuron_compile.simulator import load_kernel_source, nl, simulate
from neuron_compile.simulator.targets import use_target

HEADER = "import nki\nimport nki.language as nl\nimport nki.isa as nisa\n"


def kernel(source: str, name: str = "k"):  # type: ignore[no-untyped-def]
    return simulate(load_kernel_source(HEADER + source, filename=f"<{name}>")[name])


def test_fp4_x4_is_two_bytes_and_views_a_uint16_tensor_element_for_element() -> None:
    k = kernel('''
@nki.jit
def k(w):
    t = nl.ndarray((128, 64), dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=w.ap(dtype=nl.float4_e2m1fn_x4, pattern=[[64, 128], [1, 64]], offset=0))
    out = nl.ndarray((128, 64), dtype=nl.uint16, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t.ap(dtype=nl.uint16, pattern=[[64, 128], [1, 64]], offset=0))
    return out
''')
    w = np.arange(128 * 64, dtype=np.uint16).reshape(128, 64)
    np.testing.assert_array_equal(k(w), w)
    assert nl.ndarray((1, 1), dtype=nl.float4_e2m1fn_x4).itemsize == 2
    assert nl.ndarray((1, 1), dtype=nl.float8_e4m3fn_x4).itemsize == 4


def test_fp4_matmul_mx_unpacks_four_nibbles_low_first() -> None:
    """nc_matmul_mx over fp4 x4 operands equals NumPy on the codes unpacked low nibble first (scales 2**0)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(3)
    kd, m, n = 32, 8, 16  # contraction over 32 partitions x 4 packed values
    codes_a = rng.integers(0, 16, (kd, 4 * m), dtype=np.uint8)
    codes_b = rng.integers(0, 16, (kd, 4 * n), dtype=np.uint8)

    def pack(c: np.ndarray) -> np.ndarray:  # four codes -> one uint16, code q in nibble q
        q = c.reshape(c.shape[0], -1, 4).astype(np.uint16)
        return q[..., 0] | q[..., 1] << 4 | q[..., 2] << 8 | q[..., 3] << 12

    def values(c: np.ndarray) -> np.ndarray:
        return c.view(ml_dtypes.float4_e2m1fn).astype(np.float32)

    with use_target("trn3"):
        k = kernel('''
@nki.jit
def k(a, b, sa, sb):
    ta = nl.ndarray(a.shape, dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
    tb = nl.ndarray(b.shape, dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a.ap(dtype=nl.float4_e2m1fn_x4, pattern=[[a.shape[1], a.shape[0]], [1, a.shape[1]]]))
    nisa.dma_copy(dst=tb, src=b.ap(dtype=nl.float4_e2m1fn_x4, pattern=[[b.shape[1], b.shape[0]], [1, b.shape[1]]]))
    ssa = nl.ndarray(sa.shape, dtype=nl.uint8, buffer=nl.sbuf)
    ssb = nl.ndarray(sb.shape, dtype=nl.uint8, buffer=nl.sbuf)
    nisa.dma_copy(dst=ssa, src=sa)
    nisa.dma_copy(dst=ssb, src=sb)
    acc = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=ta, moving=tb, stationary_scale=ssa, moving_scale=ssb)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out
''')
        ones = np.full((kd, m), 127, np.uint8), np.full((kd, n), 127, np.uint8)  # uint8 scale u: 2**(u - 127)
        got = k(pack(codes_a), pack(codes_b), *ones)
    want = np.einsum("kmq,knq->mn", values(codes_a).reshape(kd, m, 4), values(codes_b).reshape(kd, n, 4))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


GATHER_FROM_RESHAPE = '''
@nki.jit
def k(x, start):
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=start.reshape((1, 1)))
    t = nl.ndarray((1, 4), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x.reshape((1, 8)).ap(pattern=[[8, 1], [1, 4]], offset=0, scalar_offset=s, indirect_dim=DIM))
    out = nl.ndarray((1, 4), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out
'''


def test_scalar_offset_indirect_dim_counts_slices_of_the_reshaped_tensor() -> None:
    k = kernel(GATHER_FROM_RESHAPE.replace("DIM", "1"))
    np.testing.assert_array_equal(k(np.arange(8, dtype=np.int32) * 10, np.array([2], np.int32)), [[20, 30, 40, 50]])
    with pytest.raises(SimulatorError, match="indirect_dim 2 out of range for a 2-D tensor"):
        kernel(GATHER_FROM_RESHAPE.replace("DIM", "2"))(np.arange(8, dtype=np.int32), np.array([0], np.int32))


SCATTER_ROWS = '''
@nki.jit
def k(row):
    out = nl.ndarray((8, 4), dtype=nl.int32, buffer=nl.shared_hbm)
    z = nl.ndarray((8, 4), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=z, value=-1)
    nisa.dma_copy(dst=out, src=z)
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=row.reshape((1, 1)))
    t = nl.ndarray((3, 4), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=t, pattern=[[1, 4]], offset=0, channel_multiplier=4)
    nisa.dma_copy(dst=out.ap(pattern=[[4, 3], [1, 4]], offset=0, scalar_offset=s, indirect_dim=0), src=t{oob})
    return out
'''


@pytest.mark.parametrize("row, written", [(3, range(3, 6)), (6, range(6, 8)), (-1, range(0, 2)),
                                          (-1000000, range(0)), (8, range(0))])
def test_runtime_offset_outside_the_tensor_skips_its_rows_with_oob_skip(row: int, written: range) -> None:
    """Rows 0..2 of t (values 4r .. 4r + 3) land on rows row .. row + 2 of out; those outside are skipped."""
    got = kernel(SCATTER_ROWS.replace("{oob}", ", oob_mode=nisa.oob_mode.skip"))(np.array([row], np.int32))
    want = np.full((8, 4), -1, np.int32)
    for r in written:
        want[r] = np.arange(4) + 4 * (r - row)
    np.testing.assert_array_equal(got, want)


def test_runtime_offset_outside_the_tensor_raises_without_oob_skip() -> None:
    with pytest.raises(SimulatorError, match=r"nisa.dma_copy: NkiTensor.ap: .* outside tensor .*oob_mode.skip"):
        kernel(SCATTER_ROWS.replace("{oob}", ""))(np.array([6], np.int32))
    # an out-of-range constant offset is a bug in the kernel, whatever the DMA's oob_mode
    with pytest.raises(SimulatorError, match="outside tensor"):
        kernel(SCATTER_ROWS.replace("offset=0, scalar_offset=s, indirect_dim=0", "offset=24")
               .replace("{oob}", ", oob_mode=nisa.oob_mode.skip"))(np.array([0], np.int32))


def test_dataclass_nkiobject_without_annotations_takes_keywords() -> None:
    k = kernel('''
from dataclasses import dataclass


@dataclass
class Section(nl.NKIObject):
    scale = None
    shift = 0.0


@dataclass
class Typed(nl.NKIObject):
    scale: float = 1.0


@nki.jit
def k(x):
    p = Section(scale=3.0)
    q = Typed(scale=0.5)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=p.scale * q.scale, op1=nl.add, operand1=p.shift)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out
''')
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(k(x), x * 1.5)


def test_vector_offset_indexes_the_rows_of_the_reshaped_tensor() -> None:
    """A scatter through a flat (reshaped) view: indices count its rows, not the storage's (nki-library router)."""
    k = kernel('''
@nki.jit
def k(idx, val):
    out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    z = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=z, value=0.0)
    nisa.dma_copy(dst=out, src=z)
    i = nl.ndarray((4, 1), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=i, src=idx)
    v = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=v, src=val)
    nisa.dma_copy(dst=out.reshape((32,)).ap([[1, 4], [1, 1]], offset=0, vector_offset=i, indirect_dim=0), src=v)
    return out
''')
    got = k(np.array([[3], [10], [21], [30]], np.uint32), np.array([[1], [2], [3], [4]], np.float32))
    want = np.zeros(32, np.float32)
    want[[3, 10, 21, 30]] = [1, 2, 3, 4]
    np.testing.assert_array_equal(got.reshape(-1), want)


def test_an_out_of_range_access_pattern_raises_only_when_an_instruction_uses_it() -> None:
    """An access pattern is a descriptor: a kernel may build one past its tensor (a padded last tile) as long as no
    instruction reads or writes through it (nki-library's output projection)."""
    source = '''
@nki.jit
def k(a):
    t = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(6):
        v = t.ap(pattern=[[4, 128], [1, 1]], offset=i)
        if i == USED:
            nisa.dma_copy(dst=out, src=v)
    return out
'''
    a = np.arange(512, dtype=np.float32).reshape(128, 4)
    np.testing.assert_array_equal(kernel(source.replace("USED", "3"))(a), a[:, 3:4])
    with pytest.raises(SimulatorError, match=r"offset 4 addresses elements 4\.\.512, outside tensor"):
        kernel(source.replace("USED", "4"))(a)


# Each of the two programs of an LNC2 launch copies its half of `a` into the output argument, then both meet at a
# core_barrier on it (the nisa.core_barrier docs' pattern).
HALVES_THEN_BARRIER = '''
def lib_kernel(a, out):
    pid = nl.program_id(0)
    t = nl.ndarray((64, 32), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[pid * 64:(pid + 1) * 64, :])
    nisa.dma_copy(dst=out[pid * 64:(pid + 1) * 64, :], src=t)
    nisa.core_barrier(out, cores=[0, 1])
    return out
'''


def _lnc2(fn, *args):  # type: ignore[no-untyped-def]
    from neuron_compile.simulator.kernel import Kernel

    return simulate(Kernel(fn)[2])(*args)


def test_kernel_arguments_are_shared_hbm_so_both_cores_can_barrier_on_an_output() -> None:
    """nki-library's router barriers on its output arguments: both programs see the caller's tensors."""
    lib = load_kernel_source(HEADER + HALVES_THEN_BARRIER, filename="<barrier>")
    a = np.arange(128 * 32, dtype=np.float32).reshape(128, 32)
    out = np.zeros_like(a)
    _lnc2(lib["lib_kernel"], a, out)
    np.testing.assert_array_equal(out, a)


@pytest.mark.parametrize("how", ["module", "closure"])
def test_a_wrapper_reaching_a_barrier_kernel_runs_both_cores_at_once(how: str) -> None:
    """An LNC2 launch runs its programs as threads when the kernel's code reaches a synchronising instruction, also
    through a function of another module or one held in a closure (nki-library's router wrapper imports the kernel
    it calls)."""
    lib = load_kernel_source(HEADER + HALVES_THEN_BARRIER, filename=f"<lib_{how}>")
    env = load_kernel_source(HEADER + '''
def wrapper(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    lib_kernel(a, out)
    return out


def make(inner):
    def wrapper(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        inner(a, out)
        return out
    return wrapper
''', filename=f"<wrapper_{how}>")
    if how == "module":
        env["lib_kernel"] = lib["lib_kernel"]  # `from lib import lib_kernel`
        fn = env["wrapper"]
    else:
        fn = env["make"](lib["lib_kernel"])
    a = np.arange(128 * 32, dtype=np.float32).reshape(128, 32)
    np.testing.assert_array_equal(_lnc2(fn, a), a)


def test_a_tensor_is_true_as_an_object() -> None:
    """``if t:`` tests the object (an optional tensor argument), not its values (nki-library's MoE)."""
    k = kernel('''
@nki.jit
def k(x, index):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    if index:
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out
''')
    x = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(k(x, np.zeros((1, 1), np.int32)), 2 * x)  # a tensor of zeros is still a tensor
    np.testing.assert_array_equal(k(x, None), x)


def test_scalar_tensor_tensor_takes_a_bf16_vector_operand_and_tensor_scalar_does_not() -> None:
    """NKI 0.6: every scalar_tensor_tensor input may be any dtype (cast to fp32); tensor_scalar's vector operands
    must be fp32."""
    import ml_dtypes

    body = HEADER + '''
@nki.jit
def k(x, s, y):
    xt = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x)
    st = nl.ndarray((128, 1), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=s)
    yt = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=yt, src=y)
    r = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)
    OP
    out = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=r)
    return out
'''
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((128, 16)).astype(np.float32) for _ in range(2))
    s = rng.standard_normal((128, 1)).astype(ml_dtypes.bfloat16)
    stt = load_kernel_source(body.replace("OP", "nisa.scalar_tensor_tensor(dst=r, data=xt, op0=nl.multiply, "
                                          "operand0=st, op1=nl.add, operand1=yt)"), "stt.py")["k"]
    np.testing.assert_allclose(simulate(stt)(x, s, y), x * s.astype(np.float32) + y, rtol=1e-6)
    ts = load_kernel_source(body.replace("OP", "nisa.tensor_scalar(dst=r, data=xt, op0=nl.multiply, operand0=st)"),
                            "ts.py")["k"]
    with pytest.raises(SimulatorError, match="vector operand dtype must be float32"):
        simulate(ts)(x, s, y)


def test_a_plain_nkiobject_may_leave_annotated_fields_for_a_method_to_set() -> None:
    """nki-library's moe_cte builds its dimension object with some annotated fields left out and derives them in a
    method; reading one before it is set raises AttributeError."""
    k = kernel('''
class Dims(nl.NKIObject):
    P: int
    F: int
    half: int

    def derive(self):
        self.half = self.F // 2


@nki.jit
def k(x):
    d = Dims(P=x.shape[0], F=x.shape[1])
    d.derive()
    t = nl.ndarray((d.P, d.half), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[:, 0:d.half])
    out = nl.ndarray((d.P, d.half), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out
''')
    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    np.testing.assert_array_equal(k(x), x[:, :4])
    early = kernel('''
class Dims(nl.NKIObject):
    P: int
    half: int


@nki.jit
def early(x):
    t = nl.ndarray((x.shape[0], Dims(P=x.shape[0]).half), dtype=x.dtype, buffer=nl.sbuf)
    return t
''', "early")
    with pytest.raises(AttributeError, match="half"):
        early(x)


@pytest.mark.parametrize("repeat", [8, 24])
def test_a_broadcast_psum_view_counts_the_elements_it_touches_against_the_access_limit(repeat: int) -> None:
    """The 4K-element limit of one PSUM access counts the elements a view touches: a one-bank (512 fp32) PSUM tile
    broadcast 24 times (stride 0) over an SBUF tile in one tensor_tensor is legal (nki-library's layernorm_tkg does
    this with its mean); a view that really spans more than 4K PSUM elements stays an error
    (test_isa_compute.py)."""
    k = kernel('''
@nki.jit
def k(x, m):
    R = x.shape[2]
    xs = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    ms = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ms, src=m)
    mp = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    nisa.tensor_copy(dst=mp, src=ms)
    o = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=o, data1=xs, data2=mp.expand_dim(2).broadcast(2, R), op=nl.subtract)
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=o)
    return out
''')
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 512, repeat)).astype(np.float32)
    m = rng.standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_array_equal(k(x, m), x - m[:, :, None])
