import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def k0_embedding(in0, in1):
    """gather kernel: aten.embedding.default"""
    out0 = nl.ndarray((156000,), dtype=nl.float32, buffer=nl.shared_hbm)
    for p0 in range(0, 520, 128):
        P = min(128, 520 - p0)
        idx = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=in1.ap(pattern=[[1, P], [1, 1]], offset=p0))
        row_stride = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=row_stride, value=300)
        idx_scaled = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=idx_scaled, data1=idx, data2=row_stride, op=nl.multiply)
        for f0 in range(0, 300, 300):
            F = min(300, 300 - f0)
            rows = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=rows, src=in0.ap(pattern=[[300, P], [1, F]], offset=f0, vector_offset=idx_scaled, indirect_dim=0))
            nisa.dma_copy(dst=out0.ap(pattern=[[300, P], [1, F]], offset=p0 * 300 + f0), src=rows)
    return out0
