// racefuzz device kernels: writers and readers of a 2-D int32 table (sglang's req_to_token) and a spin.
//
// Access shape (the simulator assumes the same, see racefuzz/sim.py):
//   * writers store at once, when they start (the simulator applies a launch's stores at its end, the same
//     instant for these short writers);
//   * readers first spin for `spin_ns` (their injected read window), then load every cell they
//     read and copy it, unchanged, into an observation buffer.
// Spins wait on %globaltimer, the GPU's nanosecond wall clock, not on clock64(): SM cycles change with
// the SM clock (boost, power capping, an idle drop -- an H200 was seen at 1307 and at 1980 MHz in one
// session), so a cycle-count spin would be 30% short or long; nanoseconds stay nanoseconds.
// A launch touches a list of rectangles. Rectangle i is described by five ints at rects[5*i]:
//   row0, nrows, col0, ncols, offset
// where `offset` indexes the values (writers) or the observation buffer (readers), row-major.
// One block per rectangle; its threads stride over the rectangle's cells.
//
// racefuzz/backends/cuda/catalog.py picks kernels by signature, so a new kernel only has to keep one of these:
//   writer: (int* table, int ld, const int* rects, const int* values)
//   reader: (const int* table, int ld, const int* rects, int* observed, long long spin_ns)
// A launch whose name is a writer (reader) here stores (loads) through it; any other name falls back to
// rf_write_cells (rf_read_cells).

#define RF_MAX_SPIN_NS (60LL * 1000 * 1000 * 1000)  // 60 s: a hard cap, far above the host-side cap

extern "C" __device__ unsigned long long rf_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __device__ void rf_spin_for(long long ns) {
    if (ns <= 0) return;
    if (ns > RF_MAX_SPIN_NS) ns = RF_MAX_SPIN_NS;
    const unsigned long long start = rf_now_ns();
    while ((long long)(rf_now_ns() - start) < ns) {
    }
}

// A delay on a stream: one thread spins, holding the stream for `ns` nanoseconds.
extern "C" __global__ void rf_spin(long long ns) {
    if (threadIdx.x == 0) rf_spin_for(ns);
}

extern "C" __device__ void rf_store_cells(int* table, int ld, const int* rects, const int* values) {
    const int* r = rects + 5 * blockIdx.x;
    const int row0 = r[0], nrows = r[1], col0 = r[2], ncols = r[3], offset = r[4];
    const int n = nrows * ncols;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int row = row0 + i / ncols, col = col0 + i % ncols;
        table[(long long)row * ld + col] = values[offset + i];
    }
}

extern "C" __device__ void rf_load_cells(const int* table, int ld, const int* rects, int* observed,
                                         long long spin_ns) {
    if (threadIdx.x == 0) rf_spin_for(spin_ns);
    __syncthreads();
    const int* r = rects + 5 * blockIdx.x;
    const int row0 = r[0], nrows = r[1], col0 = r[2], ncols = r[3], offset = r[4];
    const int n = nrows * ncols;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int row = row0 + i / ncols, col = col0 + i % ncols;
        // volatile: the load must really read global memory at this point, after the spin.
        observed[offset + i] = ((const volatile int*)table)[(long long)row * ld + col];
    }
}

// Generic entry points: any launch of a racefuzz program that only writes, or only reads.
extern "C" __global__ void rf_write_cells(int* table, int ld, const int* rects, const int* values) {
    rf_store_cells(table, ld, rects, values);
}

extern "C" __global__ void rf_read_cells(const int* table, int ld, const int* rects, int* observed,
                                         long long spin_ns) {
    rf_load_cells(table, ld, rects, observed, spin_ns);
}

// The req_to_token writers of sglang's overlap loop (same body, named for profiles and reports).
// prefill_write: alloc_for_extend / write_req_to_token_pool_triton, R[row, 0:len] of a possibly recycled row.
extern "C" __global__ void prefill_write(int* table, int ld, const int* rects, const int* values) {
    rf_store_cells(table, ld, rects, values);
}
// overalloc_write: DFLASH assign_req_to_token_pool, R[row, cur_alloc:reserved].
extern "C" __global__ void overalloc_write(int* table, int ld, const int* rects, const int* values) {
    rf_store_cells(table, ld, rects, values);
}
// rewrite_live_row: radix cache_unfinished_req / stash_chunked_request, R[row, a:b] of a live row.
extern "C" __global__ void rewrite_live_row(int* table, int ld, const int* rects, const int* values) {
    rf_store_cells(table, ld, rects, values);
}

// The readers of forward k.
// block_gather: DFLASH draft block gather, R[row, P:P+B].
extern "C" __global__ void block_gather(const int* table, int ld, const int* rects, int* observed,
                                        long long spin_ns) {
    rf_load_cells(table, ld, rects, observed, spin_ns);
}
// page_table_build: draft metadata / verify load_batch page table, R[row, 0:P+B].
extern "C" __global__ void page_table_build(const int* table, int ld, const int* rects, int* observed,
                                            long long spin_ns) {
    rf_load_cells(table, ld, rects, observed, spin_ns);
}

// ---- Gates: forced orders (racefuzz/schedule.py `orders`) ------------------------------------------------
// A forced order "launch A finishes before launch B starts" (A and B on different streams, issued in either
// order) is a pair of one-thread kernels around a flag in device memory, reset to 0 for every run:
//   rf_gate_signal(flag)                         right after A on A's stream;
//   rf_gate_wait(flag, timed_out, timeout_ns)    right before B on B's stream.
// The wait spins until the flag is set, so B's stream runs nothing after it until A has completed. If the
// flag is not set within `timeout_ns` (%globaltimer), the wait gives up and stores 1 into `timed_out`: the
// order could not be realized (the host never issued A, blocked in a sync that waits for B's stream, or
// two gates wait for each other). The host reads `timed_out` back and reports the schedule infeasible; the
// run itself always ends, never hangs.
//
// Why B sees everything A stored (the memory-ordering argument):
//  1. Stream order: the signal kernel starts only after A has completed, and a kernel's stores are
//     performed before a later kernel of the same stream starts (CUDA's stream semantics).
//  2. The signal's flag store is `st.release.gpu`: every store the signalling thread can observe before
//     it -- which by (1) includes all of A's -- is made visible at GPU scope no later than the flag (PTX
//     memory model, release pattern; the fence.acq_rel.gpu before it makes the cumulativity explicit).
//  3. The wait's flag load is `ld.acquire.gpu`: once it reads 1, every store released before the flag is
//     visible to the waiting thread, and the `fence.acq_rel.gpu` after it orders the kernel's completion
//     after that observation.
//  4. Stream order again: B starts only after the wait kernel has completed, so B's loads and stores
//     come after the acquire, and A's stores are visible to B; B's stores cannot land before A's loads,
//     since A completed (loads included) before the signal.
// Both kernels run one thread and touch one int each, so a gate costs two tiny launches. The wait backs
// off with __nanosleep between polls so that it does not hammer the flag's L2 line.

extern "C" __global__ void rf_gate_signal(int* flag) {
    if (threadIdx.x != 0) return;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(flag), "r"(1) : "memory");
}

extern "C" __global__ void rf_gate_wait(int* flag, int* timed_out, long long timeout_ns) {
    if (threadIdx.x != 0) return;
    const unsigned long long start = rf_now_ns();
    int seen = 0;
    while (true) {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
        if (seen != 0) break;
        if ((long long)(rf_now_ns() - start) >= timeout_ns) {
            *timed_out = 1;
            break;
        }
        __nanosleep(200);
    }
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
