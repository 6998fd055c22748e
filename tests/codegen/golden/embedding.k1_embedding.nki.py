import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def k1_embedding(in0, in1):
    """gather kernel: aten.embedding.default"""
    out0 = nl.ndarray((156000,), dtype=nl.float32, buffer=nl.shared_hbm)
    for g0 in range(0, 4, 4):
        T = min(4, 4 - g0)
        p0 = g0 * 128
        idx = nl.ndarray((128, 4), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx[:, 0:T], src=in1.ap(pattern=[[1, 128], [128, T]], offset=p0))
        row_stride = nl.ndarray((128, 4), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=row_stride[:, 0:T], value=300)
        idx_scaled = nl.ndarray((128, 4), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=idx_scaled[:, 0:T], data1=idx[:, 0:T], data2=row_stride[:, 0:T], op=nl.multiply)
        for f0 in range(0, 300, 300):
            F = min(300, 300 - f0)
            rows = nl.ndarray((128, 4, F), dtype=nl.float32, buffer=nl.sbuf)
            for t in range(T):
                nisa.dma_copy(dst=rows[:, t, :], src=in0.ap(pattern=[[1, 128], [1, F]], offset=f0, vector_offset=idx_scaled[:, t:t + 1], indirect_dim=0), oob_mode=nisa.oob_mode.skip)
            nisa.dma_copy(dst=out0.ap(pattern=[[300, 128], [38400, T], [1, F]], offset=p0 * 300 + f0), src=rows[:, 0:T, :])
    p0 = 512
    idx = nl.ndarray((8, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx[:, 0:1], src=in1.ap(pattern=[[1, 8], [128, 1]], offset=p0))
    row_stride = nl.ndarray((8, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=row_stride[:, 0:1], value=300)
    idx_scaled = nl.ndarray((8, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=idx_scaled[:, 0:1], data1=idx[:, 0:1], data2=row_stride[:, 0:1], op=nl.multiply)
    for f0 in range(0, 300, 300):
        F = min(300, 300 - f0)
        rows = nl.ndarray((8, 1, F), dtype=nl.float32, buffer=nl.sbuf)
        for t in range(1):
            nisa.dma_copy(dst=rows[:, t, :], src=in0.ap(pattern=[[1, 8], [1, F]], offset=f0, vector_offset=idx_scaled[:, t:t + 1], indirect_dim=0), oob_mode=nisa.oob_mode.skip)
        nisa.dma_copy(dst=out0.ap(pattern=[[300, 8], [38400, 1], [1, F]], offset=p0 * 300 + f0), src=rows[:, 0:1, :])
    return out0
