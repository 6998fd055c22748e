import nki
import nki.isa as nisa
import nki.language as nl

LAUNCH_GRID = 2  # SPMD programs (one per physical core): launch as k0_mm_add_gelu[LAUNCH_GRID](...)


@nki.jit
def k0_mm_add_gelu(in0, in1, in2):
    """matmul kernel: aten.mm.default, aten.add.Tensor, aten.gelu.default"""
    out0 = nl.ndarray((91000,), dtype=nl.float32, buffer=nl.shared_hbm)
    a_t = nl.ndarray((39000,), dtype=nl.float32, buffer=nl.private_hbm)
    b_t = nl.ndarray((210000,), dtype=nl.float32, buffer=nl.private_hbm)
    a_t_tp0 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    a_t_tp1 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    a_t_tp = [a_t_tp0, a_t_tp1]
    a_t_rows = nl.ndarray((128, 2, 300), dtype=nl.float32, buffer=nl.sbuf)
    a_t_cols = nl.ndarray((128, 3, 256), dtype=nl.float32, buffer=nl.sbuf)
    for r0 in range(0, 130, 256):
        RW = min(256, 130 - r0)
        for k0 in range(0, 300, 300):
            KW = min(300, 300 - k0)
            for g in range(0, RW, 128):
                R = min(128, RW - g)
                nisa.dma_copy(dst=a_t_rows[0:R, g // 128, 0:KW], src=in0.ap(pattern=[[300, R], [1, KW]], offset=0 + (r0 + g) * 300 + k0))
            for kt in range(0, KW, 128):
                KK = min(128, KW - kt)
                for g4 in range(0, RW, 512):
                    W4 = min(512, RW - g4)
                    h = ((kt // 128) * 1 + g4 // 512) % 2
                    for g in range(g4, g4 + W4, 128):
                        R = min(128, RW - g)
                        nisa.nc_transpose(dst=a_t_tp[h][0:KK, g - g4:g - g4 + R], data=a_t_rows[0:R, g // 128, kt:kt + KK])
                    if h % 2 == 0:
                        nisa.tensor_copy(dst=a_t_cols[0:KK, kt // 128, g4:g4 + W4], src=a_t_tp[h][0:KK, 0:W4])
                    else:
                        nisa.activation(dst=a_t_cols[0:KK, kt // 128, g4:g4 + W4], op=nl.copy, data=a_t_tp[h][0:KK, 0:W4])
            KF = KW // 128
            if KF > 0:
                nisa.dma_copy(dst=a_t.ap(pattern=[[130, 128], [16640, KF], [1, RW]], offset=k0 * 130 + r0), src=a_t_cols[0:128, 0:KF, 0:RW])
            if KW % 128:
                nisa.dma_copy(dst=a_t.ap(pattern=[[130, KW % 128], [1, RW]], offset=(k0 + KF * 128) * 130 + r0), src=a_t_cols[0:KW % 128, KF, 0:RW])
    b_t_tp0 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    b_t_tp1 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    b_t_tp = [b_t_tp0, b_t_tp1]
    b_t_rows = nl.ndarray((128, 6, 300), dtype=nl.float32, buffer=nl.sbuf)
    b_t_cols = nl.ndarray((128, 3, 768), dtype=nl.float32, buffer=nl.sbuf)
    for nb0 in range(nl.program_id(0) * 512, 700, 512 * nl.num_programs(0)):
        for r0 in range(nb0, min(nb0 + 512, 700), 768):
            RW = min(768, min(nb0 + 512, 700) - r0)
            for k0 in range(0, 300, 300):
                KW = min(300, 300 - k0)
                for g in range(0, RW, 128):
                    R = min(128, RW - g)
                    nisa.dma_copy(dst=b_t_rows[0:R, g // 128, 0:KW], src=in1.ap(pattern=[[300, R], [1, KW]], offset=0 + (r0 + g) * 300 + k0))
                for kt in range(0, KW, 128):
                    KK = min(128, KW - kt)
                    for g4 in range(0, RW, 512):
                        W4 = min(512, RW - g4)
                        h = ((kt // 128) * 2 + g4 // 512) % 2
                        for g in range(g4, g4 + W4, 128):
                            R = min(128, RW - g)
                            nisa.nc_transpose(dst=b_t_tp[h][0:KK, g - g4:g - g4 + R], data=b_t_rows[0:R, g // 128, kt:kt + KK])
                        if h % 2 == 0:
                            nisa.tensor_copy(dst=b_t_cols[0:KK, kt // 128, g4:g4 + W4], src=b_t_tp[h][0:KK, 0:W4])
                        else:
                            nisa.activation(dst=b_t_cols[0:KK, kt // 128, g4:g4 + W4], op=nl.copy, data=b_t_tp[h][0:KK, 0:W4])
                KF = KW // 128
                if KF > 0:
                    nisa.dma_copy(dst=b_t.ap(pattern=[[700, 128], [89600, KF], [1, RW]], offset=k0 * 700 + r0), src=b_t_cols[0:128, 0:KF, 0:RW])
                if KW % 128:
                    nisa.dma_copy(dst=b_t.ap(pattern=[[700, KW % 128], [1, RW]], offset=(k0 + KF * 128) * 700 + r0), src=b_t_cols[0:KW % 128, KF, 0:RW])
    acc0 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    acc1 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    acc2 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    acc3 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    acc = [acc0, acc1, acc2, acc3]
    a_blk = nl.ndarray((128, 3, 256), dtype=nl.float32, buffer=nl.sbuf)
    t = 0
    for m0 in range(0, 130, 256):
        BM = min(256, 130 - m0)
        for k0 in range(0, 300, 384):
            KW = min(384, 300 - k0)
            KF = KW // 128
            if KF > 0:
                nisa.dma_copy(dst=a_blk[0:128, k0 // 128:k0 // 128 + KF, 0:BM], src=a_t.ap(pattern=[[130, 128], [16640, KF], [1, BM]], offset=0 + k0 * 130 + m0 * 1))
            if KW % 128:
                nisa.dma_copy(dst=a_blk[0:KW % 128, k0 // 128 + KF, 0:BM], src=a_t.ap(pattern=[[130, KW % 128], [1, BM]], offset=0 + (k0 + KF * 128) * 130 + m0 * 1))
        for n0 in range(nl.program_id(0) * 512, 700, 512 * nl.num_programs(0)):
            BN = min(512, 700 - n0)
            b_blk = nl.ndarray((128, 3, 512), dtype=nl.float32, buffer=nl.sbuf)
            v2_blk = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            f0 = n0
            nisa.dma_copy(dst=v2_blk[0:128, 0:BN], src=in2.ap(pattern=[[0, 128], [1, BN]], offset=f0))
            for k0 in range(0, 300, 384):
                KW = min(384, 300 - k0)
                KF = KW // 128
                if KF > 0:
                    nisa.dma_copy(dst=b_blk[0:128, k0 // 128:k0 // 128 + KF, 0:BN], src=b_t.ap(pattern=[[700, 128], [89600, KF], [1, BN]], offset=0 + k0 * 700 + n0 * 1))
                if KW % 128:
                    nisa.dma_copy(dst=b_blk[0:KW % 128, k0 // 128 + KF, 0:BN], src=b_t.ap(pattern=[[700, KW % 128], [1, BN]], offset=0 + (k0 + KF * 128) * 700 + n0 * 1))
            for i0 in range(0, BM, 128):
                GR = min(128, BM - i0)
                RF = GR // 128
                v4_stage = nl.ndarray((128, 1, 512), dtype=nl.float32, buffer=nl.sbuf)
                for i in range(i0, i0 + GR, 128):
                    P = min(128, BM - i)
                    p0 = m0 + i
                    for j in range(0, BN, 512):
                        F = min(512, BN - j)
                        f0 = n0 + j
                        t = t + 1
                        for kt in range(0, 300, 128):
                            KK = min(128, 300 - kt)
                            nisa.nc_matmul(dst=acc[t % 4][0:P, 0:F], stationary=a_blk[0:KK, kt // 128, i:i + P], moving=b_blk[0:KK, kt // 128, j:j + F], accumulate=(kt > 0))
                        v1 = acc[t % len(acc)][0:P, 0:F]
                        v2 = v2_blk[0:P, j:j + F]
                        v3 = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
                        nisa.tensor_tensor(dst=v3, data1=v1, data2=v2, op=nl.add)
                        v4 = v4_stage[0:P, (i - i0) // 128, j:j + F]
                        nisa.activation(dst=v4, op=nl.gelu, data=v3)
                f0 = n0
                if RF > 0:
                    p0 = m0 + i0
                    nisa.dma_copy(dst=out0.ap(pattern=[[700, 128], [89600, RF], [1, BN]], offset=p0 * 700 + f0), src=v4_stage[0:128, 0:RF, 0:BN], dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)
                if GR % 128:
                    p0 = m0 + i0 + RF * 128
                    nisa.dma_copy(dst=out0.ap(pattern=[[700, GR % 128], [1, BN]], offset=p0 * 700 + f0), src=v4_stage[0:GR % 128, RF, 0:BN], dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)
    return out0
