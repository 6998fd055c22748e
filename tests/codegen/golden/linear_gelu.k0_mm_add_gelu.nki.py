import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def k0_mm_add_gelu(in0, in1, in2):
    """matmul kernel: aten.mm.default, aten.add.Tensor, aten.gelu.default"""
    out0 = nl.ndarray((91000,), dtype=nl.float32, buffer=nl.shared_hbm)
    for p0 in range(0, 130, 128):
        P = min(128, 130 - p0)
        for f0 in range(0, 700, 512):
            F = min(512, 700 - f0)
            v1_acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.psum)
            for k0 in range(0, 300, 128):
                KT = min(128, 300 - k0)
                v1_lhsT = nl.ndarray((KT, P), dtype=nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=v1_lhsT, src=in0.ap(pattern=[[1, KT], [300, P]], offset=p0 * 300 + k0 * 1))
                v1_rhs = nl.ndarray((KT, F), dtype=nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=v1_rhs, src=in1.ap(pattern=[[1, KT], [300, F]], offset=f0 * 300 + k0 * 1))
                nisa.nc_matmul(dst=v1_acc, stationary=v1_lhsT, moving=v1_rhs, accumulate=(k0 > 0))
            v1 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=v1, src=v1_acc)
            v2 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=v2, src=in2.ap(pattern=[[0, P], [1, F]], offset=f0))
            v3 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=v3, data1=v1, data2=v2, op=nl.add)
            v4 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=v4, op=nl.gelu, data=v3)
            nisa.dma_copy(dst=out0.ap(pattern=[[700, P], [1, F]], offset=p0 * 700 + f0), src=v4)
    return out0
