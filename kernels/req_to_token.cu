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
