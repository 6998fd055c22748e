"""One NKI kernel with a runtime branch, shared by the simulator and cost-model register tests."""

# out = 2 * x when max(x) > 0, else x: the doubling runs in a while_loop on an on-chip flag (a fix-up branch).
BRANCH_SRC = '''
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def k(in0):
    x = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=in0.ap([[8, 1], [1, 8]]))
    m = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=m, op=nl.maximum, data=x, axis=1)
    bad = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=bad, data=m, op0=nl.greater, operand0=0.0)
    flag = nisa.register_alloc()
    nisa.register_load(dst=flag, src=bad)

    def _exact(r):
        nisa.tensor_scalar(dst=x, data=x, op0=nl.multiply, operand0=2.0)
        return nisa.register_alloc(0)

    nl.while_loop(flag, _exact)
    out0 = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out0, src=x)
    return out0
'''
