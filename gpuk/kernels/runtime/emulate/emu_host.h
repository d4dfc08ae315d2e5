// Host side of the emulated CUDA execution model: fibers, the block scheduler, warp
// collectives, guard-paged argument buffers and the fault handler. Included once, at
// the end of the translation unit the emulated runtime generates for a kernel module.
//
// Execution: the blocks of a grid run one after another (or spread over a few host
// threads); the threads of a block are fibers on one host thread, switched only where
// CUDA threads may wait for each other (__syncthreads, warp collectives). A pass over
// the block's fibers in which no fiber makes progress is a deadlock and is reported.
#pragma once
#include <csetjmp>
#include <link.h>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <pthread.h>
#include <sys/mman.h>
#include <tuple>
#include <unistd.h>
#include <utility>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// ABI shared with gpuk/kernels/emulated_runtime.py (ctypes mirrors of these structs).
#define GPUK_EMU_ABI_VERSION 2
extern "C" {
// init_mask: one byte per data byte, 0 = never written (initcheck); null = all written.
struct gpuk_emu_arg { void* host; uint64_t nbytes; uint32_t itemsize; uint32_t flags; int32_t alias_of; int32_t pad;
                      uint8_t* init_mask; };
// Dynamic performance counters of one launch (filled when checks has CHECK_COUNTERS).
struct gpuk_emu_counters {
    uint64_t global_requests, global_sectors, global_ideal_sectors, global_load_bytes, global_store_bytes;
    uint64_t shared_requests, shared_wavefronts, shared_ideal_wavefronts, shared_bytes;
    uint64_t barriers, atomics, collectives;
};
struct gpuk_emu_config {
    uint32_t grid[3], block[3];
    uint64_t shared_mem;
    uint32_t host_threads, reverse_order;   // host_threads: the workers to run the blocks on, as
                                            // emulated_runtime.worker_count() capped them (MAX_WORKERS)
    uint64_t stack_bytes;
    uint32_t checks, n_tls_ignore;   // CHECK_* bits; used only by instrumented builds
    gpuk_emu_counters* counters;
    const uint64_t* tls_ignore;      // (offset, size) pairs of the module's thread-locals that are not
                                     // __shared__ (C++ guard variables), from its symbol table
};
struct gpuk_emu_error {
    int32_t kind, arg_index;
    int64_t byte_offset;
    int32_t access, has_location;   // access: 0 unknown, 1 read, 2 write
    uint32_t block[3], thread[3];
    char message[768];
};
}

namespace gpuk_emu {

enum { ARG_POINTER = 1, ARG_CONST = 2 };
enum ErrorKind {
    ERR_NONE = 0, ERR_OUT_OF_BOUNDS = 1, ERR_WRITE_TO_CONST = 2, ERR_STACK_OVERFLOW = 3,
    ERR_DEADLOCK = 4, ERR_BAD_COLLECTIVE = 5, ERR_TRAP = 6, ERR_FAULT = 7, ERR_BAD_LAUNCH = 8,
    ERR_INTERNAL = 9, ERR_ARITHMETIC = 10, ERR_UNDERFLOW_WRITE = 11,
};
enum { SHARED_ARG = -2, STATIC_SHARED_ARG = -3 };   // arg_index reported for shared memory
enum { ERR_RACE = 12, ERR_UNINIT = 13, ERR_CP_ASYNC = 14, ERR_SYNCCHECK = 15, ERR_WGMMA = 16 };
enum { CHECK_MEMORY = 1, CHECK_COUNTERS = 2 };   // racecheck + initcheck + cp.async; counters
enum FiberState { F_RUNNING, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE };
static const size_t PAGE = 4096;
static const unsigned char CANARY = 0xa5;

struct Fiber : ThreadState {
    void* sp;
#if !defined(__x86_64__)
    ucontext_t uc;
#endif
    int state;
    WarpOp* op;
    bool released;
    char* stack_lo;   // lowest byte of the usable stack; the page below it is a guard
};

struct Region { char* map; size_t map_len; char* data; uint64_t nbytes; bool readonly; uint8_t* init; };
struct San;
struct WgState;   // one warpgroup's wgmma queue (below)

struct Launch {
    const gpuk_emu_config* cfg;
    void (*thunk)(void**);
    void** argv;
    Region* regions;
    int nregions;
    const int* region_arg;     // argument index of each region
    volatile int failed;
    unsigned next_block;
    unsigned nblocks;
    pthread_mutex_t error_lock;
    gpuk_emu_error* err;
};

struct Worker {
    Launch* launch;
    Fiber* fibers;
    unsigned nthreads, live;
    unsigned bar_arrived, bar_gen;
    int bar_acc, bar_result;
    bool progress, aborted, in_kernel;
    void* sched_sp;
#if !defined(__x86_64__)
    ucontext_t sched_uc;
#endif
    char* stacks; size_t stacks_len, stack_size;
    char* smem_map; size_t smem_len; char* smem;
    sigjmp_buf jmp;
    gpuk_emu_error err;
    San* san;         // sanitizer / counter state; null unless an instrumented build checks or counts
    WgState* wg;      // per warpgroup (blockDim a multiple of 128), else null
};
inline thread_local Worker* t_worker = nullptr;

// ---- context switch ----
#if defined(__x86_64__)
// Saves callee-saved registers and the SSE/x87 control words on the current stack,
// stores the stack pointer in *save and resumes the context whose stack pointer is `to`.
asm(R"(
    .text
    .p2align 4
    .globl gpuk_emu_switch_ctx
    .hidden gpuk_emu_switch_ctx
    .type gpuk_emu_switch_ctx,@function
gpuk_emu_switch_ctx:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size gpuk_emu_switch_ctx, .-gpuk_emu_switch_ctx
    .globl gpuk_emu_fiber_start
    .hidden gpuk_emu_fiber_start
    .type gpuk_emu_fiber_start,@function
gpuk_emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size gpuk_emu_fiber_start, .-gpuk_emu_fiber_start
)");
extern "C" void gpuk_emu_switch_ctx(void** save, void* to);
extern "C" void gpuk_emu_fiber_start();
#endif

void fiber_main(Fiber* f);

inline void to_scheduler(Fiber* f) {
    Worker* w = t_worker;
#if defined(__x86_64__)
    gpuk_emu_switch_ctx(&f->sp, w->sched_sp);
#else
    swapcontext(&f->uc, &w->sched_uc);
#endif
}
inline void to_fiber(Worker* w, Fiber* f) {
    t_thread = f;
#if defined(__x86_64__)
    gpuk_emu_switch_ctx(&w->sched_sp, f->sp);
#else
    swapcontext(&w->sched_uc, &f->uc);
#endif
}
inline void init_fiber(Fiber* f) {
    char* top = f->stack_lo + t_worker->stack_size;
#if defined(__x86_64__)
    uint64_t* sp = reinterpret_cast<uint64_t*>(top - 64);     // 16-aligned: see fiber_start
    uint32_t mxcsr = 0x1f80; uint16_t fpucw = 0x037f;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
    sp[0] = uint64_t(mxcsr) | (uint64_t(fpucw) << 32);
    sp[1] = 0; sp[2] = 0;                                      // r15, r14
    sp[3] = reinterpret_cast<uint64_t>(&fiber_main);          // r13: entry
    sp[4] = reinterpret_cast<uint64_t>(f);                    // r12: its argument
    sp[5] = 0; sp[6] = 0;                                      // rbx, rbp
    sp[7] = reinterpret_cast<uint64_t>(&gpuk_emu_fiber_start);
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack_lo;
    f->uc.uc_stack.ss_size = t_worker->stack_size;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, reinterpret_cast<void (*)()>(&fiber_main), 1, f);
#endif
}

// ---- errors ----
inline void set_location(gpuk_emu_error* e) {
    e->has_location = t_thread != nullptr;
    e->block[0] = t_block_idx.x; e->block[1] = t_block_idx.y; e->block[2] = t_block_idx.z;
    if (t_thread) { e->thread[0] = t_thread->tid.x; e->thread[1] = t_thread->tid.y; e->thread[2] = t_thread->tid.z; }
}
inline void set_error(gpuk_emu_error* e, int kind, const char* fmt, ...) {
    e->kind = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}
// An error found inside a fiber: record it and leave the block for good.
[[noreturn]] inline void fail_in_fiber(int kind, const char* fmt, ...) {
    Worker* w = t_worker;
    w->err.kind = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err.message, sizeof w->err.message, fmt, ap);
    va_end(ap);
    set_location(&w->err);
    w->aborted = true;
    Fiber* f = static_cast<Fiber*>(t_thread);
    for (;;) to_scheduler(f);
}
[[noreturn]] inline void trap(const char* what) { fail_in_fiber(ERR_TRAP, "%s", what); }

inline void fiber_main(Fiber* f) {
    Worker* w = t_worker;
    w->launch->thunk(w->launch->argv);
    f->state = F_DONE;
    --w->live;
    w->progress = true;
    for (;;) to_scheduler(f);
}

inline void yield_waiting() { to_scheduler(static_cast<Fiber*>(t_thread)); }

// ---- sanitizer and counters (instrumented builds: GPUK_EMU_SANITIZE, see docs/kernels.md) ----
// g++ -fsanitize=thread makes every load and store of the kernel code call __tsan_readN /
// __tsan_writeN, and every atomic __tsan_atomicN_*; this file defines those hooks (no
// libtsan is linked). A hook keeps only accesses of an emulated thread to shared memory
// (dynamic: the launch's buffer; static: this module's thread-local block, where
// `__shared__` variables live) and to the argument buffers, and checks or counts them.
#if defined(GPUK_EMU_INSTRUMENTED)
#define GPUK_EMU_NOSAN __attribute__((no_sanitize("thread"))) inline
#else
#define GPUK_EMU_NOSAN inline
#endif
enum AccessKind { ACC_READ, ACC_WRITE, ACC_ATOMIC };

// Shadow of one shared-memory byte. Epochs number the barrier intervals of the worker
// (unique across blocks); stamps are the warp's collective generation at the access.
struct Cell {
    uint32_t wepoch, wstamp, repoch, rstamp, initb, pendb, rlanes;
    uint32_t wgb;     // block serial while wgn wgmma.mma_async operands not yet retired read this byte
    uint32_t wfence;  // the writer's count of fence.proxy.async at the last write (wtid's)
    uint16_t wtid, rtid, wgn;
    int16_t rwarp;
    uint8_t ignore;   // not shared memory (a guard variable of a thread-local)
};
static const uint16_t MANY_READERS = 0xffff;
struct CpEntry { char* dst; uint32_t group, bytes; unsigned char data[16]; };
struct CpQueue { CpEntry* e; uint32_t n, cap, open_group; };
struct Slot { const void* site; uint32_t n; uint64_t addr[32]; uint8_t lane[32], bytes[32]; };
struct ReqTable { Slot* slots; uint32_t n, cap; };
// A lane's access still being extended: g++ splits a float4 / uint2 access into scalar
// pieces; contiguous pieces of one kind inside one aligned 16-byte block are rejoined into
// the one vector access the GPU compiler emits (LDG/LDS.64/.128).
struct OpenAccess { const char* addr; const void* site; uint32_t size; int space, kind; };
struct San {
    bool check, count;
    char *dyn_lo, *dyn_hi, *tls_lo, *tls_hi;
    Cell *dyn_cells, *tls_cells;
    const char* emu_tls[5];
    size_t emu_tls_len[5];
    uint32_t epoch, block_serial;
    // A read of never-written shared memory is reported at the next barrier (or the block's
    // end) unless another thread's write in the same interval makes it a race first.
    bool uninit_pending; int uninit_where; int64_t uninit_offset; unsigned uninit_tid;
    uint32_t *wgen, *sync_gen, *sync_mask, *seq;
    uint32_t* proxy_fences;    // per thread: fence.proxy.async executed (never reset in a launch)
    CpQueue* cp;
    OpenAccess* open;          // per thread
    ReqTable* tables;          // [warp][space]: 0 global, 1 shared
    gpuk_emu_counters cnt;
};

GPUK_EMU_NOSAN unsigned warp_mask_full(const Worker* w, unsigned warp) {
    const unsigned rest = w->nthreads - warp * 32u;
    return rest >= 32u ? 0xffffffffu : (1u << rest) - 1u;
}
GPUK_EMU_NOSAN void describe_tid(char* out, size_t n, unsigned tid) {
    const unsigned bx = t_block_dim.x, by = t_block_dim.y;
    snprintf(out, n, "(%u, %u, %u)", tid % bx, (tid / bx) % by, tid / (bx * by));
}
inline const char* shared_name(int where) { return where == SHARED_ARG ? "dynamic shared memory" : "static __shared__ memory"; }

[[noreturn]] GPUK_EMU_NOSAN void fail_shared(int kind, int where, int64_t offset, const char* what, unsigned other) {
    Worker* w = t_worker;
    w->err.arg_index = where;
    w->err.byte_offset = offset;
    char who[48] = "";
    if (other != MANY_READERS) describe_tid(who, sizeof who, other);
    if (kind == ERR_RACE)
        fail_in_fiber(kind, "racecheck: %s hazard on %s at byte offset %lld with thread %s of the same block "
                      "(no __syncthreads, or __syncwarp for lanes of one warp, orders the two accesses)",
                      what, shared_name(where), (long long)offset, other == MANY_READERS ? "(several)" : who);
    if (kind == ERR_WGMMA)
        fail_in_fiber(kind, "wgmma: %s of %s at byte offset %lld, an operand of a wgmma.mma_async not yet retired "
                      "(wgmma.wait_group by the issuing warpgroup, then __syncthreads, come first)",
                      what, shared_name(where), (long long)offset);
    fail_in_fiber(kind, "cp.async: %s of %s at byte offset %lld, the destination of a cp.async not yet waited for "
                  "(cp_async_wait / cp.async.wait_group by the issuing thread, then __syncthreads, come first)",
                  what, shared_name(where), (long long)offset);
}

// Accesses a and b of lanes of one warp are ordered when a collective whose mask holds both
// lanes completed after a; the sanitizer keeps each lane's last collective (generation, mask).
GPUK_EMU_NOSAN bool ordered(const San* s, unsigned other, uint32_t stamp, unsigned tid) {
    return (other >> 5) == (tid >> 5) && s->sync_gen[tid] > stamp && ((s->sync_mask[tid] >> (other & 31u)) & 1u);
}

GPUK_EMU_NOSAN void shared_access(San* s, Cell* cells, int where, int64_t offset, unsigned size, int kind, unsigned tid) {
    const unsigned warp = tid >> 5, lane = tid & 31u;
    const uint32_t stamp = s->wgen[warp], epoch = s->epoch, block = s->block_serial;
    for (unsigned i = 0; i < size; ++i) {
        Cell& c = cells[offset + i];
        const int64_t at = offset + i;
        if (c.ignore) continue;
        if (kind != ACC_WRITE && c.pendb == block) fail_shared(ERR_CP_ASYNC, where, at, "read", 0);
        if (kind != ACC_WRITE && c.initb != block && !s->uninit_pending) {
            s->uninit_pending = true; s->uninit_where = where; s->uninit_offset = at; s->uninit_tid = tid;
        }
        if (kind == ACC_ATOMIC) { c.initb = block; continue; }
        if (c.wepoch == epoch && c.wtid != tid && !ordered(s, c.wtid, c.wstamp, tid))
            fail_shared(ERR_RACE, where, at, kind == ACC_READ ? "read-after-write" : "write-after-write", c.wtid);
        if (kind == ACC_READ) {
            if (c.repoch != epoch) {
                c.repoch = epoch; c.rtid = uint16_t(tid); c.rstamp = stamp; c.rwarp = int16_t(warp); c.rlanes = 1u << lane;
            } else if (c.rtid != tid) {
                c.rtid = MANY_READERS;
                if (c.rwarp != int16_t(warp)) c.rwarp = -1;
                c.rlanes |= 1u << lane;
                if (stamp > c.rstamp) c.rstamp = stamp;
            } else {
                c.rstamp = stamp;
            }
            continue;
        }
        if (c.pendb == block) fail_shared(ERR_CP_ASYNC, where, at, "write", 0);
        if (c.wgb == block && c.wgn) fail_shared(ERR_WGMMA, where, at, "write", 0);
        if (c.repoch == epoch) {
            if (c.rtid != MANY_READERS) {
                if (c.rtid != tid && !ordered(s, c.rtid, c.rstamp, tid))
                    fail_shared(ERR_RACE, where, at, "write-after-read", c.rtid);
            } else {
                const bool covered = c.rwarp == int16_t(warp) && s->sync_gen[tid] > c.rstamp &&
                                     (c.rlanes & ~(s->sync_mask[tid] | (1u << lane))) == 0;
                if (!covered) fail_shared(ERR_RACE, where, at, "write-after-read", MANY_READERS);
            }
        }
        c.wepoch = epoch; c.wtid = uint16_t(tid); c.wstamp = stamp; c.repoch = 0; c.initb = block;
        c.wfence = s->proxy_fences[tid];
    }
}

// ---- counters: lanes' k-th accesses since the warp's last flush at one code site form a
// warp-level request (uniform control flow); an access whose site differs counts alone ----
GPUK_EMU_NOSAN unsigned merged_length(uint64_t* lo, uint64_t* hi, unsigned n) {   // sorts by lo
    for (unsigned i = 1; i < n; ++i)
        for (unsigned j = i; j > 0 && lo[j] < lo[j - 1]; --j) {
            uint64_t t = lo[j]; lo[j] = lo[j - 1]; lo[j - 1] = t;
            t = hi[j]; hi[j] = hi[j - 1]; hi[j - 1] = t;
        }
    uint64_t total = 0, cur_lo = lo[0], cur_hi = hi[0];
    for (unsigned i = 1; i < n; ++i) {
        if (lo[i] <= cur_hi) { if (hi[i] > cur_hi) cur_hi = hi[i]; continue; }
        total += cur_hi - cur_lo; cur_lo = lo[i]; cur_hi = hi[i];
    }
    return unsigned(total + cur_hi - cur_lo);
}
GPUK_EMU_NOSAN void account_global(San* s, const Slot& sl) {
    uint64_t lo[32], hi[32];
    for (unsigned i = 0; i < sl.n; ++i) { lo[i] = sl.addr[i]; hi[i] = sl.addr[i] + sl.bytes[i]; }
    const unsigned bytes = merged_length(lo, hi, sl.n);
    for (unsigned i = 0; i < sl.n; ++i) { lo[i] = sl.addr[i] >> 5; hi[i] = ((sl.addr[i] + sl.bytes[i] - 1) >> 5) + 1; }
    s->cnt.global_sectors += merged_length(lo, hi, sl.n);
    s->cnt.global_ideal_sectors += (bytes + 31u) / 32u;
    s->cnt.global_requests += 1;
}
// Shared memory: 32 banks of 4 bytes; 8- and 16-byte accesses are served per half / quarter
// warp. A phase takes as many wavefronts as the most distinct words any one bank holds.
GPUK_EMU_NOSAN void account_shared(San* s, const Slot& sl) {
    unsigned size = 1;
    for (unsigned i = 0; i < sl.n; ++i) if (sl.bytes[i] > size) size = sl.bytes[i];
    const unsigned per_phase = size <= 4 ? 32u : size == 8 ? 16u : 8u;
    for (unsigned phase = 0; phase < 32u / per_phase; ++phase) {
        uint64_t words[128];
        unsigned nw = 0;
        for (unsigned i = 0; i < sl.n; ++i) {
            if (sl.lane[i] / per_phase != phase) continue;
            for (uint64_t wd = sl.addr[i] >> 2; wd <= (sl.addr[i] + sl.bytes[i] - 1) >> 2 && nw < 128; ++wd) words[nw++] = wd;
        }
        if (!nw) continue;
        unsigned per_bank[32] = {0}, most = 0;
        for (unsigned i = 0; i < nw; ++i) {
            bool seen = false;
            for (unsigned j = 0; j < i && !seen; ++j) seen = words[j] == words[i];
            if (seen) continue;
            const unsigned b = unsigned(words[i] & 31u);
            if (++per_bank[b] > most) most = per_bank[b];
        }
        s->cnt.shared_wavefronts += most;
        s->cnt.shared_ideal_wavefronts += 1;
    }
    s->cnt.shared_requests += 1;
}
GPUK_EMU_NOSAN void count_access(San* s, int space, const void* site, const void* a, unsigned size, unsigned tid) {
    if (size > 255) size = 255;
    ReqTable& t = s->tables[(tid >> 5) * 2 + space];
    const uint32_t k = s->seq[tid * 2 + space]++;
    if (k >= t.cap) {
        const uint32_t cap = k + 64 > 2 * t.cap ? k + 64 : 2 * t.cap;
        Slot* grown = static_cast<Slot*>(realloc(t.slots, cap * sizeof(Slot)));
        if (!grown) return;
        memset(grown + t.cap, 0, (cap - t.cap) * sizeof(Slot));
        t.slots = grown; t.cap = cap;
    }
    if (k >= t.n) t.n = k + 1;
    Slot& sl = t.slots[k];
    if (!sl.site) sl.site = site;
    if (sl.site != site || sl.n == 32) {
        Slot solo;
        solo.n = 1; solo.addr[0] = uint64_t(a); solo.lane[0] = uint8_t(tid & 31u); solo.bytes[0] = uint8_t(size);
        if (space == 0) account_global(s, solo); else account_shared(s, solo);
        return;
    }
    sl.addr[sl.n] = uint64_t(a); sl.lane[sl.n] = uint8_t(tid & 31u); sl.bytes[sl.n] = uint8_t(size); ++sl.n;
}
GPUK_EMU_NOSAN void count_piece(San* s, int space, int kind, const void* site, const char* a, unsigned size, unsigned tid) {
    OpenAccess& o = s->open[tid];
    if (o.size && o.space == space && o.kind == kind && a == o.addr + o.size && o.size + size <= 16 &&
        (uintptr_t(o.addr) & 7u) == 0 && ((uintptr_t(o.addr) ^ uintptr_t(a + size - 1)) & ~uintptr_t(15)) == 0) {
        o.size += size;
        return;
    }
    if (o.size) count_access(s, o.space, o.site, o.addr, o.size, tid);
    o.addr = a; o.site = site; o.size = size; o.space = space; o.kind = kind;
}
// A lane's part of a warp's global access that reads nothing (a cp.async whose source size is 0:
// zero-fill): the instruction is still the warp's one request, so the lane's next access must
// pair with the other lanes' next ones. Its open access closes and its sequence number advances
// without an address; left out, every later access of the lane at this site would be grouped
// with the others' following ones, as if split requests moved extra sectors.
GPUK_EMU_NOSAN void count_no_access(San* s, unsigned tid) {
    OpenAccess& o = s->open[tid];
    if (o.size) count_access(s, o.space, o.site, o.addr, o.size, tid);
    o.size = 0;
    ++s->seq[tid * 2];
}
GPUK_EMU_NOSAN void flush_warp(San* s, unsigned warp, unsigned nthreads) {
    for (unsigned tid = warp * 32u; tid < warp * 32u + 32u && tid < nthreads; ++tid) {
        OpenAccess& o = s->open[tid];
        if (o.size) count_access(s, o.space, o.site, o.addr, o.size, tid);
        o.size = 0;
    }
    for (int space = 0; space < 2; ++space) {
        ReqTable& t = s->tables[warp * 2 + space];
        for (uint32_t k = 0; k < t.n; ++k) {
            Slot& sl = t.slots[k];
            if (sl.n) { if (space == 0) account_global(s, sl); else account_shared(s, sl); }
            sl.site = nullptr; sl.n = 0;
        }
        t.n = 0;
    }
    for (unsigned tid = warp * 32u; tid < warp * 32u + 32u && tid < nthreads; ++tid) s->seq[tid * 2] = s->seq[tid * 2 + 1] = 0;
}

GPUK_EMU_NOSAN void on_access(const void* p, unsigned size, int kind, const void* site) {
    Worker* w = t_worker;
    if (!w || !w->san || !t_thread) return;
    San* s = w->san;
    const char* a = static_cast<const char*>(p);
    const unsigned tid = unsigned(static_cast<Fiber*>(t_thread) - w->fibers);
    Cell* cells = nullptr;
    int where = SHARED_ARG;
    int64_t offset = 0;
    if (a >= s->dyn_lo && a < s->dyn_hi) {
        cells = s->dyn_cells; offset = a - s->dyn_lo;
        if (a + size > s->dyn_hi) size = unsigned(s->dyn_hi - a);
    } else if (a >= s->tls_lo && a < s->tls_hi) {
        for (int i = 0; i < 5; ++i) if (a >= s->emu_tls[i] && a < s->emu_tls[i] + s->emu_tls_len[i]) return;
        cells = s->tls_cells; offset = a - s->tls_lo; where = STATIC_SHARED_ARG;
        if (a + size > s->tls_hi) size = unsigned(s->tls_hi - a);
    }
    if (cells) {
        if (s->check) shared_access(s, cells, where, offset, size, kind, tid);
        if (s->count) {
            if (kind == ACC_ATOMIC) ++s->cnt.atomics;
            else { count_piece(s, 1, kind, site, a, size, tid); s->cnt.shared_bytes += size; }
        }
        return;
    }
    const Launch* L = w->launch;
    for (int r = 0; r < L->nregions; ++r) {
        const Region& g = L->regions[r];
        if (a < g.data || a >= g.data + g.nbytes) continue;
        const uint64_t off = uint64_t(a - g.data);
        const unsigned n = off + size > g.nbytes ? unsigned(g.nbytes - off) : size;
        if (s->check && g.init) {
            if (kind != ACC_WRITE)
                for (unsigned i = 0; i < n; ++i)
                    if (!g.init[off + i]) {
                        w->err.arg_index = L->region_arg[r];
                        w->err.byte_offset = int64_t(off + i);
                        fail_in_fiber(ERR_UNINIT, "initcheck: read of uninitialized global memory: argument #%d at byte "
                                      "offset %lld (allocated with empty() and never written)", L->region_arg[r],
                                      (long long)(off + i));
                    }
            memset(g.init + off, 1, n);
        }
        if (s->count) {
            if (kind == ACC_ATOMIC) { ++s->cnt.atomics; return; }
            count_piece(s, 0, kind, site, a, size, tid);
            (kind == ACC_READ ? s->cnt.global_load_bytes : s->cnt.global_store_bytes) += size;
        }
        return;
    }
}

// The deferred initcheck report, located at the reading thread.
GPUK_EMU_NOSAN bool take_uninit_report(Worker* w) {
    San* s = w->san;
    if (!s || !s->uninit_pending) return false;
    gpuk_emu_error* e = &w->err;
    set_error(e, ERR_UNINIT, "initcheck: read of uninitialized %s at byte offset %lld (no thread of this block "
              "wrote it before the read, nor in the same barrier interval)", shared_name(s->uninit_where),
              (long long)s->uninit_offset);
    e->arg_index = s->uninit_where;
    e->byte_offset = s->uninit_offset;
    e->has_location = 1;
    e->block[0] = t_block_idx.x; e->block[1] = t_block_idx.y; e->block[2] = t_block_idx.z;
    const unsigned bx = t_block_dim.x, by = t_block_dim.y, tid = s->uninit_tid;
    e->thread[0] = tid % bx; e->thread[1] = (tid / bx) % by; e->thread[2] = tid / (bx * by);
    return true;
}

// Called by the scheduler: block start, barrier completion, collective completion.
GPUK_EMU_NOSAN void san_block_start(Worker* w) {
    San* s = w->san;
    ++s->block_serial;
    ++s->epoch;
    for (unsigned t = 0; t < w->nthreads; ++t) {
        s->cp[t].n = 0; s->cp[t].open_group = 0; s->seq[2 * t] = s->seq[2 * t + 1] = 0; s->open[t].size = 0;
    }
}
GPUK_EMU_NOSAN void san_flush_all(Worker* w) {
    if (w->san && w->san->count)
        for (unsigned warp = 0; warp * 32u < w->nthreads; ++warp) flush_warp(w->san, warp, w->nthreads);
}
GPUK_EMU_NOSAN void san_barrier(Worker* w) {
    San* s = w->san;
    if (take_uninit_report(w)) {   // inside the last fiber to arrive: leave the block as fail_in_fiber does
        w->aborted = true;
        for (;;) to_scheduler(static_cast<Fiber*>(t_thread));
    }
    ++s->epoch;
    ++s->cnt.barriers;
    san_flush_all(w);
}
GPUK_EMU_NOSAN void san_collective(Worker* w, unsigned warp, unsigned mask) {
    San* s = w->san;
    const uint32_t g = ++s->wgen[warp];
    for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l) & 1u) { s->sync_gen[warp * 32u + l] = g; s->sync_mask[warp * 32u + l] = mask; }
    ++s->cnt.collectives;
    if (s->count && mask == warp_mask_full(w, warp)) flush_warp(s, warp, w->nthreads);
}

// ---- cp.async: with the memory checks on, the copy is queued per thread and lands at its
// wait; until then its destination reads as poison (0xff bytes) and any access is reported ----
GPUK_EMU_NOSAN void cp_async(void* dst, const void* src, unsigned bytes, unsigned src_bytes) {
    Worker* w = t_worker;
    San* s = w ? w->san : nullptr;
    if (s && t_thread) {
        const void* site = __builtin_return_address(0);
        if (src_bytes) on_access(src, src_bytes, ACC_READ, site);
        else if (s->count) count_no_access(s, unsigned(static_cast<Fiber*>(t_thread) - w->fibers));
        if (s->check) {
            char* d = static_cast<char*>(dst);
            const bool shared = (d >= s->dyn_lo && d + bytes <= s->dyn_hi) || (d >= s->tls_lo && d + bytes <= s->tls_hi);
            if (!shared) fail_in_fiber(ERR_CP_ASYNC, "cp.async: the destination %p is not shared memory", dst);
            on_access(dst, bytes, ACC_WRITE, site);   // hazards with this interval's other accesses
            Cell* cells = d >= s->dyn_lo && d < s->dyn_hi ? s->dyn_cells + (d - s->dyn_lo) : s->tls_cells + (d - s->tls_lo);
            for (unsigned i = 0; i < bytes; ++i) cells[i].pendb = s->block_serial;
            CpQueue& q = s->cp[static_cast<Fiber*>(t_thread) - w->fibers];
            if (q.n == q.cap) {
                const uint32_t cap = q.cap ? 2 * q.cap : 16;
                CpEntry* grown = static_cast<CpEntry*>(realloc(q.e, cap * sizeof(CpEntry)));
                if (!grown) fail_in_fiber(ERR_INTERNAL, "out of host memory for cp.async queues");
                q.e = grown; q.cap = cap;
            }
            CpEntry& e = q.e[q.n++];
            e.dst = d; e.group = q.open_group; e.bytes = bytes;
            memset(e.data, 0, sizeof e.data);
            if (src_bytes) memcpy(e.data, src, src_bytes);
            memset(d, 0xff, bytes);   // poison until the wait
            return;
        }
        if (s->count) on_access(dst, bytes, ACC_WRITE, site);
    }
    if (src_bytes) memcpy(dst, src, src_bytes);
    if (bytes > src_bytes) memset(static_cast<char*>(dst) + src_bytes, 0, bytes - src_bytes);
}
GPUK_EMU_NOSAN void cp_async_commit() {
    Worker* w = t_worker;
    if (w && w->san && w->san->check && t_thread) ++w->san->cp[static_cast<Fiber*>(t_thread) - w->fibers].open_group;
}
GPUK_EMU_NOSAN void cp_async_wait(int pending_groups) {
    Worker* w = t_worker;
    if (!w || !w->san || !w->san->check || !t_thread) return;
    San* s = w->san;
    const unsigned tid = unsigned(static_cast<Fiber*>(t_thread) - w->fibers);
    CpQueue& q = s->cp[tid];
    if (pending_groups < 0) ++q.open_group;           // wait_all == commit_group; wait_group 0
    const int64_t keep = pending_groups < 0 ? 0 : pending_groups;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < q.n; ++i) {
        CpEntry& e = q.e[i];
        if (int64_t(e.group) + keep < int64_t(q.open_group)) {
            const bool dyn = e.dst >= s->dyn_lo && e.dst < s->dyn_hi;
            Cell* cells = dyn ? s->dyn_cells + (e.dst - s->dyn_lo) : s->tls_cells + (e.dst - s->tls_lo);
            for (unsigned b = 0; b < e.bytes; ++b) cells[b].pendb = 0;
            memcpy(e.dst, e.data, e.bytes);
            shared_access(s, dyn ? s->dyn_cells : s->tls_cells, dyn ? SHARED_ARG : STATIC_SHARED_ARG,
                          dyn ? e.dst - s->dyn_lo : e.dst - s->tls_lo, e.bytes, ACC_WRITE, tid);
        } else {
            q.e[kept++] = e;
        }
    }
    q.n = kept;
}

// The module's thread-local block (this host thread's copy): static __shared__ lives there.
struct TlsSearch { const void* probe; char* lo; size_t len; };
inline int find_tls(struct dl_phdr_info* info, size_t, void* data) {
    TlsSearch* t = static_cast<TlsSearch*>(data);
    bool mine = false;
    size_t tls_len = 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD && uintptr_t(t->probe) >= start && uintptr_t(t->probe) < start + ph.p_memsz) mine = true;
        if (ph.p_type == PT_TLS) tls_len = ph.p_memsz;
    }
    if (!mine) return 0;
    t->lo = static_cast<char*>(info->dlpi_tls_data);
    t->len = tls_len;
    return 1;
}

inline San* san_create(Worker* w) {
    const gpuk_emu_config* c = w->launch->cfg;
    San* s = static_cast<San*>(calloc(1, sizeof(San)));
    if (!s) return nullptr;
    s->check = (c->checks & CHECK_MEMORY) != 0;
    s->count = (c->checks & CHECK_COUNTERS) != 0;
    s->dyn_lo = w->smem; s->dyn_hi = w->smem + c->shared_mem;
    TlsSearch t{reinterpret_cast<const void*>(&find_tls), nullptr, 0};
    dl_iterate_phdr(&find_tls, &t);
    s->tls_lo = t.lo; s->tls_hi = t.lo ? t.lo + t.len : nullptr;
    const char* emu[5] = {reinterpret_cast<const char*>(&t_thread), reinterpret_cast<const char*>(&t_block_idx),
                          reinterpret_cast<const char*>(&t_block_dim), reinterpret_cast<const char*>(&t_grid_dim),
                          reinterpret_cast<const char*>(&t_worker)};
    const size_t len[5] = {sizeof t_thread, sizeof t_block_idx, sizeof t_block_dim, sizeof t_grid_dim, sizeof t_worker};
    for (int i = 0; i < 5; ++i) { s->emu_tls[i] = emu[i]; s->emu_tls_len[i] = len[i]; }
    const unsigned n = w->nthreads, warps = (n + 31u) / 32u;
    s->dyn_cells = static_cast<Cell*>(calloc(c->shared_mem + 16, sizeof(Cell)));
    s->tls_cells = static_cast<Cell*>(calloc(t.len + 16, sizeof(Cell)));
    for (uint32_t k = 0; s->tls_cells && k < c->n_tls_ignore; ++k)
        for (uint64_t b = c->tls_ignore[2 * k]; b < c->tls_ignore[2 * k] + c->tls_ignore[2 * k + 1] && b < t.len; ++b)
            s->tls_cells[b].ignore = 1;
    s->wgen = static_cast<uint32_t*>(calloc(warps, 4));
    s->sync_gen = static_cast<uint32_t*>(calloc(warps * 32u, 4));
    s->sync_mask = static_cast<uint32_t*>(calloc(warps * 32u, 4));
    s->seq = static_cast<uint32_t*>(calloc(2 * warps * 32u, 4));
    s->proxy_fences = static_cast<uint32_t*>(calloc(n, 4));
    s->cp = static_cast<CpQueue*>(calloc(n, sizeof(CpQueue)));
    s->open = static_cast<OpenAccess*>(calloc(n, sizeof(OpenAccess)));
    s->tables = static_cast<ReqTable*>(calloc(2 * warps, sizeof(ReqTable)));
    return s;
}
inline bool san_complete(const San* s) {
    return s->dyn_cells && s->tls_cells && s->wgen && s->sync_gen && s->sync_mask && s->seq && s->proxy_fences && s->cp &&
           s->open && s->tables;
}
inline void san_destroy(San* s, unsigned nthreads) {
    if (!s) return;
    const unsigned warps = (nthreads + 31u) / 32u;
    if (s->cp) for (unsigned t = 0; t < nthreads; ++t) free(s->cp[t].e);
    if (s->tables) for (unsigned k = 0; k < 2 * warps; ++k) free(s->tables[k].slots);
    free(s->dyn_cells); free(s->tls_cells); free(s->wgen); free(s->sync_gen); free(s->sync_mask);
    free(s->seq); free(s->proxy_fences); free(s->cp); free(s->open); free(s->tables); free(s);
}

// ---- __syncthreads ----
inline void sync_block_impl(int predicate, int* count) {
    Worker* w = t_worker;
    Fiber* f = static_cast<Fiber*>(t_thread);
    const unsigned gen = w->bar_gen;
    w->bar_acc += predicate != 0;
    f->state = F_WAIT_BLOCK;
    w->progress = true;
    if (++w->bar_arrived == w->nthreads) {
        if (w->san) san_barrier(w);
        w->bar_arrived = 0;
        w->bar_result = w->bar_acc;
        w->bar_acc = 0;
        ++w->bar_gen;
    } else {
        while (w->bar_gen == gen) yield_waiting();
    }
    f->state = F_RUNNING;
    w->progress = true;
    if (count) *count = w->bar_result;
}

// ---- warp collectives ----
inline unsigned warp_lanes(Worker* w, unsigned warp) {
    const unsigned rest = w->nthreads - warp * 32u;
    return rest < 32u ? rest : 32u;
}
inline unsigned active_mask() {
    Worker* w = t_worker;
    const unsigned warp = t_thread->warp, n = warp_lanes(w, warp);
    unsigned m = 0;
    for (unsigned l = 0; l < n; ++l)
        if (w->fibers[warp * 32u + l].state != F_DONE) m |= 1u << l;
    return m;
}

inline void complete_mma(Fiber* lanes, int op) {
    float A[16][16], B[16][8], C[16][8];
    const int K = op == OP_MMA_TF32 ? 8 : 16;
    auto lowp = [op](uint32_t bits16) {
        return op == OP_MMA_F16 ? half_bits_to_float(uint16_t(bits16)) : bf16_bits_to_float(uint16_t(bits16));
    };
    for (int l = 0; l < 32; ++l) {
        const MmaOperands* m = static_cast<const MmaOperands*>(lanes[l].op->data);
        const int g = l >> 2, t = l & 3;
        if (op == OP_MMA_TF32) {
            // The tensor core reads only the 19 tf32 bits of each register.
            for (int r = 0; r < 4; ++r) A[g + 8 * (r & 1)][t + 4 * (r >> 1)] = bits_float(m->a[r] & 0xffffe000u);
            for (int r = 0; r < 2; ++r) B[t + 4 * r][g] = bits_float(m->b[r] & 0xffffe000u);
        } else {
            for (int r = 0; r < 4; ++r) {
                const int row = g + 8 * (r & 1), col = 2 * (t + 4 * (r >> 1));
                A[row][col] = lowp(m->a[r] & 0xffffu);
                A[row][col + 1] = lowp(m->a[r] >> 16);
            }
            for (int r = 0; r < 2; ++r) {
                const int k = 2 * (t + 4 * r);
                B[k][g] = lowp(m->b[r] & 0xffffu);
                B[k + 1][g] = lowp(m->b[r] >> 16);
            }
        }
        for (int r = 0; r < 4; ++r) C[g + 8 * (r >> 1)][2 * t + (r & 1)] = m->c[r];
    }
    for (int l = 0; l < 32; ++l) {   // all C read above, so d may alias c
        const MmaOperands* m = static_cast<const MmaOperands*>(lanes[l].op->data);
        const int g = l >> 2, t = l & 3;
        for (int r = 0; r < 4; ++r) {
            const int row = g + 8 * (r >> 1), col = 2 * t + (r & 1);
            float acc = C[row][col];
            for (int k = 0; k < K; ++k) acc += A[row][k] * B[k][col];
            m->d[r] = acc;
        }
    }
}

static const char* const kWarpOpNames[] = {
    "__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
    "__ballot_sync", "__any_sync", "__all_sync", "__reduce_add_sync", "__reduce_min_sync",
    "__reduce_max_sync", "__reduce_min_sync", "__reduce_max_sync",
    "mma_m16n8k8_tf32", "mma_m16n8k16_f16", "mma_m16n8k16_bf16", "ldmatrix", "wgmma.mma_async"};

// ldmatrix.m8n8.xNUM[.trans].b16 (PTX ISA): lanes 8i..8i+7 supplied rows 0..7 of matrix i.
// Register i of lane l gets (row l/4, 16-bit cols 2(l%4), 2(l%4)+1) of matrix i; with .trans
// (rows 2(l%4), 2(l%4)+1, col l/4). The lower index goes to the low half.
inline void complete_ldmatrix(Fiber* lanes) {
    const LdmatrixOperands* ops[32];
    for (int l = 0; l < 32; ++l) ops[l] = static_cast<const LdmatrixOperands*>(lanes[l].op->data);
    auto half = [&](int matrix, int row, int col) -> uint32_t {
        return (ops[matrix * 8 + row]->row[col >> 1] >> (16 * (col & 1))) & 0xffffu;
    };
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < ops[l]->num; ++i)
            ops[l]->out[i] = ops[l]->trans ? half(i, 2 * t, g) | (half(i, 2 * t + 1, g) << 16)
                                           : half(i, g, 2 * t) | (half(i, g, 2 * t + 1) << 16);
    }
}

// Run by the last lane of `mask` to arrive: computes every lane's result.
inline void complete_warp_op(Fiber* lanes, unsigned mask, int op) {
    for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l) & 1u && lanes[l].op->op != op)
            fail_in_fiber(ERR_BAD_COLLECTIVE, "%s met %s of lane %u in one warp collective (mask 0x%08x)",
                          kWarpOpNames[op], kWarpOpNames[lanes[l].op->op], l, mask);
    if (op == OP_LDMATRIX) {
        if (mask != 0xffffffffu)
            fail_in_fiber(ERR_BAD_COLLECTIVE, "ldmatrix needs all 32 lanes (mask 0xffffffff), got mask 0x%08x", mask);
        for (unsigned l = 0; l < 32; ++l)
            if (static_cast<const LdmatrixOperands*>(lanes[l].op->data)->num !=
                static_cast<const LdmatrixOperands*>(lanes[0].op->data)->num)
                fail_in_fiber(ERR_BAD_COLLECTIVE, "ldmatrix: lanes disagree on the matrix count (.x1/.x2/.x4)");
        complete_ldmatrix(lanes);
    } else if (op >= OP_MMA_TF32) {
        if (mask != 0xffffffffu)
            fail_in_fiber(ERR_BAD_COLLECTIVE, "%s needs all 32 lanes (mask 0xffffffff), got mask 0x%08x",
                          kWarpOpNames[op], mask);
        complete_mma(lanes, op);
    } else if (op >= OP_SHFL_IDX && op <= OP_SHFL_XOR) {
        for (unsigned l = 0; l < 32; ++l) {
            if (!((mask >> l) & 1u)) continue;
            WarpOp* o = lanes[l].op;
            const int width = o->width;
            if (width < 1 || width > 32 || (width & (width - 1)))
                fail_in_fiber(ERR_BAD_COLLECTIVE, "%s: width must be a power of 2 in [1, 32], got %d", kWarpOpNames[op], width);
            const unsigned base = l & ~unsigned(width - 1), pos = l - base;
            unsigned src = l;
            if (op == OP_SHFL_IDX) src = base + (unsigned(o->arg) & unsigned(width - 1));
            else if (op == OP_SHFL_UP) src = pos >= unsigned(o->arg) ? l - unsigned(o->arg) : l;
            else if (op == OP_SHFL_DOWN) src = pos + unsigned(o->arg) < unsigned(width) ? l + unsigned(o->arg) : l;
            else { src = l ^ unsigned(o->arg); if (src >= base + unsigned(width)) src = l; }
            if (!((mask >> src) & 1u))
                fail_in_fiber(ERR_BAD_COLLECTIVE, "%s: lane %u reads lane %u, which is not in mask 0x%08x",
                              kWarpOpNames[op], l, src, mask);
            o->result = lanes[src].op->value;
        }
    } else {
        uint64_t acc = 0;
        int64_t iacc = 0;
        bool first = true;
        for (unsigned l = 0; l < 32; ++l) {
            if (!((mask >> l) & 1u)) continue;
            const uint64_t v = lanes[l].op->value;
            switch (op) {
                case OP_BALLOT: acc |= uint64_t(v != 0) << l; break;
                case OP_ANY: acc |= v != 0; break;
                case OP_ALL: acc = first ? (v != 0) : (acc && v != 0); break;
                case OP_REDUCE_ADD: acc = uint32_t(acc + v); break;
                case OP_REDUCE_MIN_U: acc = first ? v : cmin(acc, v); break;
                case OP_REDUCE_MAX_U: acc = first ? v : cmax(acc, v); break;
                case OP_REDUCE_MIN_I: iacc = first ? int32_t(v) : cmin<int64_t>(iacc, int32_t(v)); acc = uint32_t(iacc); break;
                case OP_REDUCE_MAX_I: iacc = first ? int32_t(v) : cmax<int64_t>(iacc, int32_t(v)); acc = uint32_t(iacc); break;
                default: break;
            }
            first = false;
        }
        for (unsigned l = 0; l < 32; ++l)
            if ((mask >> l) & 1u) lanes[l].op->result = acc;
    }
    Worker* w = t_worker;
    if (w->san) san_collective(w, unsigned(lanes - w->fibers) / 32u, mask);
    for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l) & 1u) lanes[l].released = true;
}

inline uint64_t warp_op(WarpOp& op) {
    Worker* w = t_worker;
    Fiber* f = static_cast<Fiber*>(t_thread);
    const unsigned nlanes = warp_lanes(w, f->warp);
    if (!((op.mask >> f->lane) & 1u))
        fail_in_fiber(ERR_BAD_COLLECTIVE, "%s: calling lane %u is not in mask 0x%08x", kWarpOpNames[op.op], f->lane, op.mask);
    if (nlanes < 32 && (op.mask >> nlanes) != 0)
        fail_in_fiber(ERR_BAD_COLLECTIVE, "%s: mask 0x%08x names lanes that do not exist (warp %u has %u threads)",
                      kWarpOpNames[op.op], op.mask, f->warp, nlanes);
    f->op = &op;
    f->released = false;
    f->state = F_WAIT_WARP;
    w->progress = true;
    Fiber* lanes = w->fibers + f->warp * 32u;
    bool complete = true;
    for (unsigned l = 0; l < nlanes && complete; ++l)
        if ((op.mask >> l) & 1u)
            complete = lanes[l].state == F_WAIT_WARP && !lanes[l].released && lanes[l].op->mask == op.mask;
    if (complete) complete_warp_op(lanes, op.mask, op.op);
    while (!f->released) yield_waiting();
    f->state = F_RUNNING;
    f->op = nullptr;
    w->progress = true;
    return op.result;
}

inline void* dynamic_shared_base() { return t_worker->smem; }

// ---- wgmma (PTX ISA 9.7.15): warpgroup MMA from shared-memory descriptors ----
// wgmma.mma_async is a collective of the 128 threads of a warpgroup (threads 128g..128g+127).
// It is checked and queued when the last thread arrives; the product is computed when the
// first thread of the warpgroup waits for its group (wgmma.wait_group), as the hardware may
// read its operands any time until then: the shared memory is read at that wait, into every
// thread's accumulators. With the memory checks on:
// - at the issue, an operand byte this block wrote must have been fenced by its writer
//   (fence.proxy.async, wgmma_mark);
// - a write to an operand byte is reported until all 128 threads have waited for the op (a
//   landing cp.async is such a write; a read of a byte still being landed is reported at the
//   wait). Stricter than PTX, which lets a thread write once its own wait returned: the
//   fibers pass a wait_group one at a time, and the kernels hand a tile back through a
//   barrier anyway. The operand reads count, for the race check, as the first waiter's at its
//   wait, so a write after the waits needs that barrier too.
// Supported: m64nNk16 f16/bf16 and m64nNk8 tf32 with float32 accumulators, both operands
// K-major (imm-trans 0) in shared memory, scale-a = scale-b = 1.
struct WgOp {
    int kind, n;
    uint64_t desc_a, desc_b;
    int scale_d;
    uint32_t group;    // the commit group it belongs to: groups its warpgroup committed before its issue
    uint32_t waited;   // threads whose wgmma.wait_group retired it (128: its operand bytes are free)
    bool done;         // computed (at the first of those waits)
    float* d[128];     // each thread's accumulators
};
struct WgState {
    WgOp* ops; uint32_t head, n, cap;     // ops [head, n) not yet waited for by all 128 threads, in issue order
    uint32_t next[128];                   // per thread: the first op (index into ops) it has not waited for
    uint32_t open_group[128];             // per thread: groups committed so far
    bool fenced[128];                     // per thread: a wgmma.fence since its last wait
};

GPUK_EMU_NOSAN WgState* wg_state(const char* what) {
    Worker* w = t_worker;
    if (!w->wg)
        fail_in_fiber(ERR_WGMMA, "%s: the block has %u threads; wgmma runs on warpgroups of 128 threads (the "
                      "block size must be a multiple of 128)", what, w->nthreads);
    return &w->wg[unsigned(static_cast<Fiber*>(t_thread) - w->fibers) / 128u];
}
GPUK_EMU_NOSAN unsigned thread_in_warpgroup() {
    return unsigned(static_cast<Fiber*>(t_thread) - t_worker->fibers) % 128u;
}

GPUK_EMU_NOSAN unsigned shared_window_address(const void* p) {
    Worker* w = t_worker;
    const char* a = static_cast<const char*>(p);
    const uint64_t size = w->launch->cfg->shared_mem;
    if (a < w->smem || a >= w->smem + size)
        fail_in_fiber(ERR_WGMMA, "shared address of %p: not in the launch's dynamic shared memory (%llu bytes); the "
                      "emulator gives shared-window addresses (wgmma descriptors) to extern __shared__ memory only",
                      p, (unsigned long long)size);
    return unsigned(a - w->smem);
}

// Byte offset in shared memory of byte `kbyte` (along K) of row `row` (along M or N) of a
// K-major operand (PTX ISA, canonical layouts): no swizzle: 8x16-byte core matrices, LBO
// apart along K and SBO apart along M/N; 32/64/128-byte swizzle: rows of W bytes in 8-row
// atoms SBO apart, then byte-address bits 4.. XOR bits 7.. (Swizzle<1|2|3, 4, 3>).
GPUK_EMU_NOSAN uint32_t wgmma_byte_address(uint64_t desc, int row, int kbyte) {
    const uint32_t start = uint32_t(desc & 0x3fffu) << 4, lbo = uint32_t((desc >> 16) & 0x3fffu) << 4;
    const uint32_t sbo = uint32_t((desc >> 32) & 0x3fffu) << 4;
    const int mode = int(desc >> 62);
    if (mode == 0) return start + uint32_t(row / 8) * sbo + uint32_t(row % 8) * 16u + uint32_t(kbyte / 16) * lbo + kbyte % 16;
    const int bits = mode == 1 ? 3 : mode == 2 ? 2 : 1;   // 128B, 64B, 32B
    const uint32_t addr = start + uint32_t(row / 8) * sbo + uint32_t(row % 8) * (16u << bits) + uint32_t(kbyte);
    return addr ^ (((addr >> 7) & ((1u << bits) - 1u)) << 4);
}

GPUK_EMU_NOSAN void wgmma_check_desc(const char* which, uint64_t desc, int rows, int kbytes) {
    const uint64_t reserved = (3ull << 14) | (3ull << 30) | (7ull << 46) | (0x3ffull << 52);
    if (desc & reserved)
        fail_in_fiber(ERR_WGMMA, "wgmma.mma_async: descriptor %s = 0x%016llx sets reserved bits (0x%016llx)", which,
                      (unsigned long long)desc, (unsigned long long)(desc & reserved));
    if ((desc >> 49) & 7u)
        fail_in_fiber(ERR_WGMMA, "wgmma.mma_async: descriptor %s has a matrix base offset (%u); the emulator supports "
                      "swizzle patterns that start on their repeat boundary only (base offset 0)", which,
                      unsigned((desc >> 49) & 7u));
    const int mode = int(desc >> 62);
    if (mode) {
        const uint32_t width = 16u << (mode == 1 ? 3 : mode == 2 ? 2 : 1), start = uint32_t(desc & 0x3fffu) << 4;
        if (start % width + uint32_t(kbytes) > width)
            fail_in_fiber(ERR_WGMMA, "wgmma.mma_async: descriptor %s starts %u bytes into a %u-byte swizzle row; a "
                          "k-step of %d bytes would cross into the next row", which, start % width, width, kbytes);
    }
    const uint64_t size = t_worker->launch->cfg->shared_mem;
    for (int r = 0; r < rows; ++r)
        for (int kb = 0; kb < kbytes; kb += 16) {
            const uint32_t a = wgmma_byte_address(desc, r, kb);
            if (a + 16u > size)
                fail_in_fiber(ERR_WGMMA, "wgmma.mma_async: descriptor %s = 0x%016llx reaches byte %u of shared memory "
                              "(row %d); the launch has %llu bytes of dynamic shared memory", which,
                              (unsigned long long)desc, a + 15u, r, (unsigned long long)size);
        }
}

// Marks (+1) or releases (-1) the operand bytes of an op: a write to a marked byte is reported.
// At the issue (+1), an operand byte this block wrote through the generic proxy (st.shared, a
// landed cp.async) must have been followed by a fence.proxy.async of its writer: wgmma reads
// shared memory through the async proxy (PTX ISA 9.7.15.4).
GPUK_EMU_NOSAN void wgmma_mark(Worker* w, const WgOp& op, int delta) {
    San* s = w->san;
    if (!s || !s->check) return;
    const int kbytes = 32;   // k16 x 2 bytes, k8 x 4 bytes
    for (int which = 0; which < 2; ++which) {
        const uint64_t desc = which ? op.desc_b : op.desc_a;
        const int rows = which ? op.n : 64;
        for (int r = 0; r < rows; ++r)
            for (int kb = 0; kb < kbytes; ++kb) {
                const uint32_t at = wgmma_byte_address(desc, r, kb);
                Cell& c = s->dyn_cells[at];
                if (delta > 0 && c.initb == s->block_serial && !c.ignore && c.wfence == s->proxy_fences[c.wtid]) {
                    char who[48];
                    describe_tid(who, sizeof who, c.wtid);
                    w->err.arg_index = SHARED_ARG;
                    w->err.byte_offset = at;
                    fail_in_fiber(ERR_WGMMA, "wgmma.mma_async: operand %s reads byte %u of dynamic shared memory, "
                                  "written by thread %s through the generic proxy (a store or a landed cp.async) "
                                  "with no fence.proxy.async by that thread since (wgmma reads through the async "
                                  "proxy: fence, then __syncthreads, before the wgmma)", which ? "b" : "a", at, who);
                }
                if (c.wgb != s->block_serial) { c.wgb = s->block_serial; c.wgn = 0; }
                c.wgn = uint16_t(c.wgn + delta);
            }
    }
}

// Computes one queued op for all 128 threads: D = A B (+ D when scale_d), A 64xK, B K x N.
GPUK_EMU_NOSAN void wgmma_execute(Worker* w, const WgOp& op, unsigned tid) {
    const int K = op.kind == WGMMA_TF32 ? 8 : 16, esize = op.kind == WGMMA_TF32 ? 4 : 2;
    San* s = w->san;
    auto element = [&](uint64_t desc, int row, int k) {
        const uint32_t a = wgmma_byte_address(desc, row, k * esize);
        if (s && s->check) shared_access(s, s->dyn_cells, SHARED_ARG, a, unsigned(esize), ACC_READ, tid);
        const char* p = w->smem + a;
        if (op.kind == WGMMA_TF32) { uint32_t u; memcpy(&u, p, 4); return bits_float(u & 0xffffe000u); }   // 19 tf32 bits
        uint16_t h; memcpy(&h, p, 2);
        return op.kind == WGMMA_F16 ? half_bits_to_float(h) : bf16_bits_to_float(h);
    };
    static thread_local float A[64][16], B[256][16];
    for (int m = 0; m < 64; ++m) for (int k = 0; k < K; ++k) A[m][k] = element(op.desc_a, m, k);
    for (int n = 0; n < op.n; ++n) for (int k = 0; k < K; ++k) B[n][k] = element(op.desc_b, n, k);
    for (int t = 0; t < 128; ++t) {
        const int warp = t / 32, lane = t % 32;
        for (int j = 0; j < op.n / 8; ++j)
            for (int i = 0; i < 2; ++i)
                for (int c = 0; c < 2; ++c) {
                    const int row = 16 * warp + lane / 4 + 8 * i, col = 8 * j + 2 * (lane % 4) + c;
                    float* d = op.d[t] + 4 * j + 2 * i + c;
                    float acc = op.scale_d ? *d : 0.0f;
                    for (int k = 0; k < K; ++k) acc += A[row][k] * B[col][k];
                    *d = acc;
                }
    }
}

// Run by the last of the 128 threads to arrive.
GPUK_EMU_NOSAN void complete_wgmma(Worker* w, WgState* st, Fiber* group) {
    const WgmmaOperands* first = static_cast<const WgmmaOperands*>(group[0].op->data);
    for (unsigned t = 0; t < 128; ++t) {
        const WgmmaOperands* o = static_cast<const WgmmaOperands*>(group[t].op->data);
        t_thread = &group[t];
        if (o->kind != first->kind || o->n != first->n || o->desc_a != first->desc_a || o->desc_b != first->desc_b ||
            o->scale_d != first->scale_d)
            fail_in_fiber(ERR_WGMMA, "wgmma.mma_async: the threads of a warpgroup disagree on the instruction or its "
                          "descriptors (thread 0: desc-a 0x%016llx desc-b 0x%016llx; this thread: 0x%016llx 0x%016llx); "
                          ".sync.aligned needs one instruction for all 128", (unsigned long long)first->desc_a,
                          (unsigned long long)first->desc_b, (unsigned long long)o->desc_a, (unsigned long long)o->desc_b);
        if (!st->fenced[t])
            fail_in_fiber(ERR_WGMMA, "wgmma.mma_async without a wgmma.fence since this thread's last wgmma.wait_group "
                          "(the fence orders the accumulator registers before the first wgmma of a batch)");
        if (st->open_group[t] != st->open_group[0])
            fail_in_fiber(ERR_WGMMA, "wgmma.mma_async: this thread committed %u wgmma groups, thread 0 of its warpgroup "
                          "%u (wgmma.commit_group is .sync.aligned too)", st->open_group[t], st->open_group[0]);
    }
    t_thread = &group[127];
    if (first->n % 8 || first->n < 8 || first->n > 256)
        fail_in_fiber(ERR_WGMMA, "wgmma.mma_async: N must be a multiple of 8 in [8, 256], got %d", first->n);
    wgmma_check_desc("a", first->desc_a, 64, 32);
    wgmma_check_desc("b", first->desc_b, first->n, 32);
    if (st->n == st->cap) {
        const uint32_t cap = st->cap ? 2 * st->cap : 16;
        WgOp* grown = static_cast<WgOp*>(realloc(st->ops, cap * sizeof(WgOp)));
        if (!grown) fail_in_fiber(ERR_INTERNAL, "out of host memory for the wgmma queue");
        st->ops = grown; st->cap = cap;
    }
    WgOp& op = st->ops[st->n++];
    op.kind = first->kind; op.n = first->n; op.desc_a = first->desc_a; op.desc_b = first->desc_b;
    op.scale_d = first->scale_d; op.group = st->open_group[0]; op.waited = 0; op.done = false;
    for (unsigned t = 0; t < 128; ++t) op.d[t] = static_cast<const WgmmaOperands*>(group[t].op->data)->d;
    wgmma_mark(w, op, +1);
    if (w->san) for (unsigned k = 0; k < 4; ++k) san_collective(w, unsigned(group - w->fibers) / 32u + k, 0xffffffffu);
    for (unsigned t = 0; t < 128; ++t) group[t].released = true;
}

GPUK_EMU_NOSAN void wgmma_mma_async(WgmmaOperands& operands) {
    Worker* w = t_worker;
    Fiber* f = static_cast<Fiber*>(t_thread);
    WgState* st = wg_state("wgmma.mma_async");
    WarpOp op{OP_WGMMA, 0xffffffffu, 0, 0, 32, 0, &operands};
    f->op = &op;
    f->released = false;
    f->state = F_WAIT_WARP;
    w->progress = true;
    Fiber* group = w->fibers + unsigned(f - w->fibers) / 128u * 128u;
    bool complete = true;
    for (unsigned t = 0; t < 128 && complete; ++t)
        complete = group[t].state == F_WAIT_WARP && !group[t].released && group[t].op->op == OP_WGMMA;
    if (complete) {
        complete_wgmma(w, st, group);
        t_thread = f;
    }
    while (!f->released) yield_waiting();
    f->state = F_RUNNING;
    f->op = nullptr;
    w->progress = true;
}
GPUK_EMU_NOSAN void wgmma_fence() { wg_state("wgmma.fence")->fenced[thread_in_warpgroup()] = true; }
GPUK_EMU_NOSAN void proxy_fence_async() {   // fence.proxy.async.shared::cta of this thread
    Worker* w = t_worker;
    if (!w || !w->san || !w->san->check || !t_thread) return;
    ++w->san->proxy_fences[static_cast<Fiber*>(t_thread) - w->fibers];
}
GPUK_EMU_NOSAN void wgmma_commit() { ++wg_state("wgmma.commit_group")->open_group[thread_in_warpgroup()]; }
GPUK_EMU_NOSAN void wgmma_wait(int pending_groups) {
    Worker* w = t_worker;
    WgState* st = wg_state("wgmma.wait_group");
    const unsigned t = thread_in_warpgroup();
    const uint32_t open = st->open_group[t];
    const unsigned tid = unsigned(static_cast<Fiber*>(t_thread) - w->fibers);
    for (; st->next[t] < st->n && int64_t(st->ops[st->next[t]].group) + pending_groups < int64_t(open); ++st->next[t]) {
        WgOp& op = st->ops[st->next[t]];
        if (!op.done) { wgmma_execute(w, op, tid); op.done = true; }
        if (++op.waited == 128) wgmma_mark(w, op, -1);   // every thread knows it retired: writes are free again
    }
    while (st->head < st->n && st->ops[st->head].waited == 128) ++st->head;
    if (st->head == st->n) {   // all retired everywhere: start the queue over
        st->head = st->n = 0;
        memset(st->next, 0, sizeof st->next);
    } else if (st->head >= 64 && 2 * st->head >= st->n) {   // drop the retired front
        memmove(st->ops, st->ops + st->head, (st->n - st->head) * sizeof(WgOp));
        for (unsigned k = 0; k < 128; ++k) st->next[k] -= st->head;
        st->n -= st->head;
        st->head = 0;
    }
    st->fenced[t] = false;
}
// At the block's end: an op never retired leaves its accumulators undefined.
inline bool wgmma_all_retired(Worker* w) {
    if (!w->wg) return true;
    for (unsigned g = 0; g < w->nthreads / 128u; ++g)
        for (uint32_t k = w->wg[g].head; k < w->wg[g].n; ++k)
            if (!w->wg[g].ops[k].done) {
                t_thread = nullptr;
                set_error(&w->err, ERR_WGMMA, "wgmma: warpgroup %u ended with a wgmma.mma_async never retired by a "
                          "wgmma.wait_group (its accumulators are undefined)", g);
                return false;
            }
    return true;
}
inline void wgmma_block_start(Worker* w) {
    if (!w->wg) return;
    for (unsigned g = 0; g < w->nthreads / 128u; ++g) {
        WgState& st = w->wg[g];
        st.head = st.n = 0;
        memset(st.next, 0, sizeof st.next);
        memset(st.open_group, 0, sizeof st.open_group);
        memset(st.fenced, 0, sizeof st.fenced);
    }
}

// ---- one block ----
inline void report_deadlock(Worker* w) {
    unsigned at_barrier = 0, at_warp = 0, exited = 0;
    Fiber* first = nullptr;
    unsigned first_mask = 0;
    for (unsigned i = 0; i < w->nthreads; ++i) {
        Fiber& f = w->fibers[i];
        if (f.state == F_DONE) { ++exited; continue; }
        if (!first) first = &f;
        if (f.state == F_WAIT_BLOCK) ++at_barrier;
        else if (f.state == F_WAIT_WARP) { ++at_warp; if (!first_mask) first_mask = f.op->mask; }
    }
    t_thread = first;
    set_location(&w->err);
    set_error(&w->err, ERR_DEADLOCK,
              "deadlock: %u thread(s) wait at __syncthreads, %u wait in warp collectives, %u exited "
              "(every thread of the block must reach each barrier; every lane of a mask each collective)",
              at_barrier, at_warp, exited);
    if (at_warp) {
        // synccheck: name the lanes of the first waiting collective's mask that did not arrive.
        Fiber* waiting = nullptr;
        for (unsigned i = 0; i < w->nthreads && !waiting; ++i)
            if (w->fibers[i].state == F_WAIT_WARP) waiting = &w->fibers[i];
        if (waiting->op->op == OP_WGMMA) {   // a warpgroup collective: count its 128 threads
            const unsigned first = unsigned(waiting - w->fibers) / 128u * 128u;
            unsigned arrived = 0, done = 0, at_bar = 0;
            for (unsigned t = first; t < first + 128u; ++t) {
                const Fiber& f = w->fibers[t];
                if (f.state == F_DONE) ++done;
                else if (f.state == F_WAIT_BLOCK) ++at_bar;
                else if (f.op && f.op->op == OP_WGMMA) ++arrived;
            }
            t_thread = waiting;
            set_location(&w->err);
            w->err.kind = ERR_SYNCCHECK;
            snprintf(w->err.message, sizeof w->err.message, "synccheck: wgmma.mma_async in warpgroup %u: %u of its 128 "
                     "threads arrived, %u exited, %u wait at __syncthreads, %u elsewhere (.sync.aligned: all 128 threads "
                     "of the warpgroup issue each wgmma)", first / 128u, arrived, done, at_bar, 128u - arrived - done - at_bar);
            return;
        }
        const unsigned warp = waiting->warp, n = warp_lanes(w, warp), mask = waiting->op->mask;
        unsigned arrived = 0, exited = 0, at_bar = 0, elsewhere = 0;
        for (unsigned l = 0; l < n; ++l) {
            if (!((mask >> l) & 1u)) continue;
            const Fiber& f = w->fibers[warp * 32u + l];
            if (f.state == F_DONE) exited |= 1u << l;
            else if (f.state == F_WAIT_BLOCK) at_bar |= 1u << l;
            else if (f.op && f.op->op == waiting->op->op && f.op->mask == mask) arrived |= 1u << l;
            else elsewhere |= 1u << l;
        }
        t_thread = waiting;
        set_location(&w->err);
        const char* deadlock = w->err.message;
        char text[768];
        snprintf(text, sizeof text, "synccheck: %s with mask 0x%08x in warp %u: lanes 0x%08x arrived; lanes named by the "
                 "mask but not arriving: 0x%08x exited, 0x%08x wait at __syncthreads, 0x%08x wait in another collective "
                 "or with another mask (%s)", kWarpOpNames[waiting->op->op], mask, warp, arrived, exited, at_bar,
                 elsewhere, deadlock);
        w->err.kind = ERR_SYNCCHECK;
        snprintf(w->err.message, sizeof w->err.message, "%s", text);
    }
}

inline bool run_block(Worker* w, unsigned block_linear) {
    const gpuk_emu_config* c = w->launch->cfg;
    t_block_idx = uint3{block_linear % c->grid[0], (block_linear / c->grid[0]) % c->grid[1],
                        block_linear / (c->grid[0] * c->grid[1])};
    const unsigned bx = c->block[0], by = c->block[1];
    for (unsigned i = 0; i < w->nthreads; ++i) {
        Fiber& f = w->fibers[i];
        f.tid = uint3{i % bx, (i / bx) % by, i / (bx * by)};
        f.lane = i & 31u;
        f.warp = i >> 5;
        f.state = F_RUNNING;
        f.op = nullptr;
        f.released = false;
        init_fiber(&f);
    }
    w->live = w->nthreads;
    w->bar_arrived = 0; w->bar_acc = 0;
    w->aborted = false;
    if (w->san) san_block_start(w);
    wgmma_block_start(w);
    while (w->live) {
        w->progress = false;
        for (unsigned k = 0; k < w->nthreads; ++k) {
            Fiber* f = &w->fibers[c->reverse_order ? w->nthreads - 1 - k : k];
            if (f->state == F_DONE) continue;
            to_fiber(w, f);
            t_thread = nullptr;
            if (w->aborted) return false;
        }
        if (w->live && !w->progress) { report_deadlock(w); return false; }
    }
    san_flush_all(w);
    if (!wgmma_all_retired(w)) return false;
    return !take_uninit_report(w);
}

// ---- faults ----
struct SavedHandlers { struct sigaction segv, bus, fpe; };
inline SavedHandlers g_saved;

inline void classify_fault(Worker* w, int sig, siginfo_t* si, void* uctx) {
    gpuk_emu_error* e = &w->err;
    set_location(e);
    if (sig == SIGFPE) { set_error(e, ERR_ARITHMETIC, "arithmetic exception (integer division by zero?)"); return; }
    char* addr = static_cast<char*>(si->si_addr);
    int access = 0;
#if defined(__x86_64__)
    if (sig == SIGSEGV && uctx)
        access = (static_cast<ucontext_t*>(uctx)->uc_mcontext.gregs[REG_ERR] & 2) ? 2 : 1;
#endif
    e->access = access;
    const char* verb = access == 2 ? "write" : access == 1 ? "read" : "access";
    const Launch* L = w->launch;
    for (int r = 0; r < L->nregions; ++r) {
        const Region& g = L->regions[r];
        if (addr < g.map || addr >= g.map + g.map_len) continue;
        e->arg_index = L->region_arg[r];
        e->byte_offset = int64_t(addr - g.data);
        if (addr >= g.data && addr < g.data + g.nbytes) {
            set_error(e, ERR_WRITE_TO_CONST, "write to const argument #%d at byte %lld of %llu",
                      e->arg_index, (long long)e->byte_offset, (unsigned long long)g.nbytes);
        } else {
            set_error(e, ERR_OUT_OF_BOUNDS, "out-of-bounds %s of argument #%d at byte offset %lld (buffer has %llu bytes)",
                      verb, e->arg_index, (long long)e->byte_offset, (unsigned long long)g.nbytes);
        }
        return;
    }
    if (w->smem_map && addr >= w->smem_map && addr < w->smem_map + w->smem_len) {
        e->arg_index = SHARED_ARG;
        e->byte_offset = int64_t(addr - w->smem);
        set_error(e, ERR_OUT_OF_BOUNDS, "out-of-bounds %s of dynamic shared memory at byte offset %lld (shared_mem=%llu)",
                  verb, (long long)e->byte_offset, (unsigned long long)L->cfg->shared_mem);
        return;
    }
    if (addr >= w->stacks && addr < w->stacks + w->stacks_len) {
        set_error(e, ERR_STACK_OVERFLOW, "stack overflow of an emulated thread (%llu-byte stacks; raise GPUK_EMULATE_STACK_KB)",
                  (unsigned long long)w->stack_size);
        return;
    }
    set_error(e, ERR_FAULT, "invalid memory %s at %p (not an argument buffer: wild pointer, or a misaligned vector access)",
              verb, static_cast<void*>(addr));
}

inline void on_fault(int sig, siginfo_t* si, void* uctx) {
    Worker* w = t_worker;
    if (w && w->in_kernel) {
        w->in_kernel = false;
        classify_fault(w, sig, si, uctx);
        siglongjmp(w->jmp, 1);
    }
    // Not ours: hand the signal to whoever had it before (e.g. Python's faulthandler).
    const struct sigaction& old = sig == SIGSEGV ? g_saved.segv : sig == SIGBUS ? g_saved.bus : g_saved.fpe;
    if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction) { old.sa_sigaction(sig, si, uctx); return; }
    sigaction(sig, &old, nullptr);   // re-executing the instruction raises it again under the old handler
}

inline void install_handlers() {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = &on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_saved.segv);
    sigaction(SIGBUS, &sa, &g_saved.bus);
    sigaction(SIGFPE, &sa, &g_saved.fpe);
}
inline void restore_handlers() {
    sigaction(SIGSEGV, &g_saved.segv, nullptr);
    sigaction(SIGBUS, &g_saved.bus, nullptr);
    sigaction(SIGFPE, &g_saved.fpe, nullptr);
}

// ---- workers ----
inline void* map_pages(size_t len) {
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
}

inline void* worker_main(void* arg) {
    Worker* w = static_cast<Worker*>(arg);
    Launch* L = w->launch;
    const gpuk_emu_config* c = L->cfg;
    t_worker = w;
    t_block_dim = dim3(c->block[0], c->block[1], c->block[2]);
    t_grid_dim = dim3(c->grid[0], c->grid[1], c->grid[2]);
    w->nthreads = c->block[0] * c->block[1] * c->block[2];
    w->stack_size = (c->stack_bytes + PAGE - 1) / PAGE * PAGE;
    const size_t slot = w->stack_size + PAGE;
    w->stacks_len = slot * w->nthreads;
    w->stacks = static_cast<char*>(map_pages(w->stacks_len));
    w->smem_len = (c->shared_mem + 15) / 16 * 16;
    w->smem_len = (w->smem_len + PAGE - 1) / PAGE * PAGE + PAGE;
    w->smem_map = static_cast<char*>(map_pages(w->smem_len));
    w->fibers = static_cast<Fiber*>(calloc(w->nthreads, sizeof(Fiber)));
    w->wg = w->nthreads % 128u ? nullptr : static_cast<WgState*>(calloc(w->nthreads / 128u, sizeof(WgState)));
    w->err.arg_index = -1;   // errors name an argument only when they set one
    stack_t alt, old_alt;
    alt.ss_size = 64 * 1024;
    alt.ss_sp = malloc(alt.ss_size);
    alt.ss_flags = 0;
    if (!w->stacks || !w->smem_map || !w->fibers || !alt.ss_sp) {
        set_error(&w->err, ERR_INTERNAL, "out of host memory for %u fiber stacks", w->nthreads);
    } else {
        for (unsigned i = 0; i < w->nthreads; ++i) {
            mprotect(w->stacks + i * slot, PAGE, PROT_NONE);
            w->fibers[i].stack_lo = w->stacks + i * slot + PAGE;
        }
        char* guard = w->smem_map + w->smem_len - PAGE;
        mprotect(guard, PAGE, PROT_NONE);
        w->smem = guard - (c->shared_mem + 15) / 16 * 16;
        memset(w->smem_map, 0xff, w->smem_len - PAGE);   // uninitialised shared memory reads as NaN / -1
#if defined(GPUK_EMU_INSTRUMENTED)
        if (c->checks) {
            w->san = san_create(w);
            if (!w->san || !san_complete(w->san)) set_error(&w->err, ERR_INTERNAL, "out of host memory for sanitizer shadows");
        }
#endif
        sigaltstack(&alt, &old_alt);
        if (sigsetjmp(w->jmp, 1) == 0 && w->err.kind == ERR_NONE) {
            for (;;) {
                if (L->failed) break;
                const unsigned b = __atomic_fetch_add(&L->next_block, 1u, __ATOMIC_RELAXED);
                if (b >= L->nblocks) break;
                w->in_kernel = true;
                const bool ok = run_block(w, b);
                w->in_kernel = false;
                if (!ok) break;
            }
        }
        t_thread = nullptr;
        sigaltstack(&old_alt, nullptr);
    }
    if (w->err.kind != ERR_NONE) {
        pthread_mutex_lock(&L->error_lock);
        if (!L->failed) { *L->err = w->err; L->failed = 1; }
        pthread_mutex_unlock(&L->error_lock);
    }
    if (w->san) {
        if (w->san->count && c->counters) {
            pthread_mutex_lock(&L->error_lock);
            uint64_t* total = reinterpret_cast<uint64_t*>(c->counters);
            const uint64_t* mine = reinterpret_cast<const uint64_t*>(&w->san->cnt);
            for (size_t k = 0; k < sizeof(gpuk_emu_counters) / 8; ++k) total[k] += mine[k];
            pthread_mutex_unlock(&L->error_lock);
        }
        san_destroy(w->san, w->nthreads);
        w->san = nullptr;
    }
    if (w->stacks) munmap(w->stacks, w->stacks_len);
    if (w->smem_map) munmap(w->smem_map, w->smem_len);
    free(w->fibers);
    if (w->wg) for (unsigned g = 0; g < w->nthreads / 128u; ++g) free(w->wg[g].ops);
    free(w->wg);
    free(alt.ss_sp);
    t_worker = nullptr;
    return nullptr;
}

// CUDA's launch limits (grid and block sizes) are runtime.launch_dims' to check, before any
// launch reaches the emulator (their constants: contracts/geometry.py, runtime/__init__.py).
// This checks what the emulator itself needs: no empty dimension, thread indices that fit the
// sanitizer's 16-bit thread ids, a block count that fits its 32-bit block counter.
inline bool check_config(const gpuk_emu_config* c, gpuk_emu_error* e) {
    const uint64_t threads = uint64_t(c->block[0]) * c->block[1] * c->block[2];
    if (threads == 0 || threads >= MANY_READERS || c->grid[0] == 0 || c->grid[1] == 0 || c->grid[2] == 0) {
        set_error(e, ERR_BAD_LAUNCH, "invalid launch configuration grid=(%u,%u,%u) block=(%u,%u,%u)",
                  c->grid[0], c->grid[1], c->grid[2], c->block[0], c->block[1], c->block[2]);
        return false;
    }
    if (uint64_t(c->grid[0]) * c->grid[1] * c->grid[2] > 0xffffffffull) {
        set_error(e, ERR_BAD_LAUNCH, "the emulator runs at most 2^32-1 blocks per launch");
        return false;
    }
    return true;
}

// Copies each pointer argument into its own mapping whose data ends on a PROT_NONE
// page (with another PROT_NONE page before), runs the grid, copies results back.
inline int launch(const gpuk_emu_config* cfg, gpuk_emu_arg* args, int nargs, gpuk_emu_error* err,
                  void (*thunk)(void**)) {
    memset(err, 0, sizeof *err);
    err->arg_index = -1;
    if (!check_config(cfg, err)) return err->kind;
    void* ptr_values[64];
    void* argv[64];
    Region regions[64];
    int region_arg[64], arg_region[64];
    int nregions = 0;
    if (nargs > 64) { set_error(err, ERR_BAD_LAUNCH, "more than 64 kernel arguments"); return err->kind; }
    int status = 0;
    for (int i = 0; i < nargs && !status; ++i) {
        if (!(args[i].flags & ARG_POINTER)) { argv[i] = args[i].host; continue; }
        if (args[i].alias_of >= 0) {
            arg_region[i] = arg_region[args[i].alias_of];
            ptr_values[i] = regions[arg_region[i]].data;
            argv[i] = &ptr_values[i];
            continue;
        }
        const uint64_t pages = (args[i].nbytes + PAGE - 1) / PAGE;
        Region& g = regions[nregions];
        g.map_len = (pages + 2) * PAGE;
        g.map = static_cast<char*>(map_pages(g.map_len));
        if (!g.map) { set_error(err, ERR_INTERNAL, "mmap of %llu bytes failed", (unsigned long long)g.map_len); status = 1; break; }
        g.nbytes = args[i].nbytes;
        g.data = g.map + (pages + 1) * PAGE - g.nbytes;
        g.readonly = (args[i].flags & ARG_CONST) != 0;
        g.init = args[i].init_mask;
        mprotect(g.map, PAGE, PROT_NONE);
        mprotect(g.map + (pages + 1) * PAGE, PAGE, PROT_NONE);
        memset(g.map + PAGE, CANARY, size_t(g.data - g.map - PAGE));
        if (g.nbytes) memcpy(g.data, args[i].host, g.nbytes);
        if (g.readonly && pages) mprotect(g.map + PAGE, pages * PAGE, PROT_READ);
        region_arg[nregions] = i;
        arg_region[i] = nregions;
        ptr_values[i] = g.data;
        argv[i] = &ptr_values[i];
        ++nregions;
    }
    if (!status) {
        Launch L;
        L.cfg = cfg; L.thunk = thunk; L.argv = argv; L.regions = regions; L.nregions = nregions;
        L.region_arg = region_arg; L.failed = 0; L.next_block = 0;
        L.nblocks = cfg->grid[0] * cfg->grid[1] * cfg->grid[2];
        L.err = err;
        pthread_mutex_init(&L.error_lock, nullptr);
        unsigned nworkers = cfg->host_threads ? cfg->host_threads : 1;   // capped by the caller
        if (nworkers > L.nblocks) nworkers = L.nblocks;
        Worker* workers = static_cast<Worker*>(calloc(nworkers, sizeof(Worker)));
        pthread_t* tids = static_cast<pthread_t*>(calloc(nworkers, sizeof(pthread_t)));
        if (!workers || !tids) {
            set_error(err, ERR_INTERNAL, "out of host memory for %u worker threads", nworkers);
            status = 1;
        } else {
            install_handlers();
            for (unsigned k = 0; k < nworkers; ++k) workers[k].launch = &L;
            for (unsigned k = 1; k < nworkers; ++k) pthread_create(&tids[k], nullptr, &worker_main, &workers[k]);
            worker_main(&workers[0]);
            for (unsigned k = 1; k < nworkers; ++k) pthread_join(tids[k], nullptr);
            restore_handlers();
            status = L.failed;
        }
        free(tids);
        free(workers);
        pthread_mutex_destroy(&L.error_lock);
    }
    for (int r = 0; r < nregions && !status; ++r) {   // underflow writes land in the slack before the data
        const Region& g = regions[r];
        for (const char* p = g.map + PAGE; p < g.data; ++p)
            if (static_cast<unsigned char>(*p) != CANARY) {
                err->arg_index = region_arg[r];
                err->byte_offset = int64_t(p - g.data);
                set_error(err, ERR_UNDERFLOW_WRITE, "write before the start of argument #%d at byte offset %lld "
                          "(found after the launch; thread unknown)", region_arg[r], (long long)err->byte_offset);
                status = 1;
                break;
            }
    }
    for (int r = 0; r < nregions; ++r) {
        const Region& g = regions[r];
        if (!status && !g.readonly && g.nbytes) memcpy(args[region_arg[r]].host, g.data, g.nbytes);
        munmap(g.map, g.map_len);
    }
    return status ? (err->kind ? err->kind : ERR_INTERNAL) : 0;
}

// Compile-time check that the Python-side signature parser agrees with the compiler.
template <class F> struct fn_traits;
template <class... P> struct fn_traits<void (*)(P...)> {
    using params = std::tuple<P...>;
    static constexpr size_t arity = sizeof...(P);
};
template <class F, size_t I> constexpr bool param_is(bool pointer, size_t size) {
    using P = typename std::tuple_element<I, typename fn_traits<F>::params>::type;
    return std::is_pointer<P>::value == pointer && (pointer || sizeof(P) == size);
}
template <class... P, size_t... I>
inline void invoke_impl(void (*k)(P...), void** a, std::index_sequence<I...>) {
    k(*static_cast<typename std::remove_cv<typename std::remove_reference<P>::type>::type*>(a[I])...);
}
template <class... P> inline void invoke(void (*k)(P...), void** a) {
    invoke_impl(k, a, std::index_sequence_for<P...>{});
}

}  // namespace gpuk_emu

#if defined(GPUK_EMU_INSTRUMENTED)
// ThreadSanitizer's instrumentation calls (GCC 12 ABI), implemented by the emulator.
#define GPUK_EMU_HOOK extern "C" __attribute__((visibility("hidden"), no_sanitize("thread")))
GPUK_EMU_HOOK void __tsan_init() {}
GPUK_EMU_HOOK void __tsan_func_entry(void*) {}
GPUK_EMU_HOOK void __tsan_func_exit() {}
#define GPUK_EMU_RW(N)                                                                                                  \
    GPUK_EMU_HOOK void __tsan_read##N(void* p) { ::gpuk_emu::on_access(p, N, ::gpuk_emu::ACC_READ, __builtin_return_address(0)); } \
    GPUK_EMU_HOOK void __tsan_write##N(void* p) { ::gpuk_emu::on_access(p, N, ::gpuk_emu::ACC_WRITE, __builtin_return_address(0)); } \
    GPUK_EMU_HOOK void __tsan_unaligned_read##N(void* p) { ::gpuk_emu::on_access(p, N, ::gpuk_emu::ACC_READ, __builtin_return_address(0)); } \
    GPUK_EMU_HOOK void __tsan_unaligned_write##N(void* p) { ::gpuk_emu::on_access(p, N, ::gpuk_emu::ACC_WRITE, __builtin_return_address(0)); }
GPUK_EMU_RW(1) GPUK_EMU_RW(2) GPUK_EMU_RW(4) GPUK_EMU_RW(8) GPUK_EMU_RW(16)
#undef GPUK_EMU_RW
GPUK_EMU_HOOK void __tsan_read_range(void* p, unsigned long n) { ::gpuk_emu::on_access(p, unsigned(n), ::gpuk_emu::ACC_READ, __builtin_return_address(0)); }
GPUK_EMU_HOOK void __tsan_write_range(void* p, unsigned long n) { ::gpuk_emu::on_access(p, unsigned(n), ::gpuk_emu::ACC_WRITE, __builtin_return_address(0)); }
GPUK_EMU_HOOK void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
GPUK_EMU_HOOK void __tsan_atomic_signal_fence(int) {}
#define GPUK_EMU_NOTE(a, kind) ::gpuk_emu::on_access(const_cast<const void*>(static_cast<const volatile void*>(a)), sizeof(T), kind, __builtin_return_address(0))
#define GPUK_EMU_ATOMICS(N, TYPE)                                                                                       \
    GPUK_EMU_HOOK TYPE __tsan_atomic##N##_load(const volatile TYPE* a, int) {                                            \
        typedef TYPE T; GPUK_EMU_NOTE(a, ::gpuk_emu::ACC_READ); return __atomic_load_n(a, __ATOMIC_SEQ_CST); }          \
    GPUK_EMU_HOOK void __tsan_atomic##N##_store(volatile TYPE* a, TYPE v, int) {                                         \
        typedef TYPE T; GPUK_EMU_NOTE(a, ::gpuk_emu::ACC_WRITE); __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }            \
    GPUK_EMU_ATOMIC_RMW(N, TYPE, exchange, __atomic_exchange_n)                                                         \
    GPUK_EMU_ATOMIC_RMW(N, TYPE, fetch_add, __atomic_fetch_add)                                                         \
    GPUK_EMU_ATOMIC_RMW(N, TYPE, fetch_sub, __atomic_fetch_sub)                                                         \
    GPUK_EMU_ATOMIC_RMW(N, TYPE, fetch_and, __atomic_fetch_and)                                                         \
    GPUK_EMU_ATOMIC_RMW(N, TYPE, fetch_or, __atomic_fetch_or)                                                           \
    GPUK_EMU_ATOMIC_RMW(N, TYPE, fetch_xor, __atomic_fetch_xor)                                                         \
    GPUK_EMU_ATOMIC_RMW(N, TYPE, fetch_nand, __atomic_fetch_nand)                                                       \
    GPUK_EMU_HOOK int __tsan_atomic##N##_compare_exchange_strong(volatile TYPE* a, TYPE* c, TYPE v, int, int) {         \
        typedef TYPE T; GPUK_EMU_NOTE(a, ::gpuk_emu::ACC_ATOMIC);                                                       \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); }                       \
    GPUK_EMU_HOOK int __tsan_atomic##N##_compare_exchange_weak(volatile TYPE* a, TYPE* c, TYPE v, int, int) {           \
        typedef TYPE T; GPUK_EMU_NOTE(a, ::gpuk_emu::ACC_ATOMIC);                                                       \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); }                       \
    GPUK_EMU_HOOK TYPE __tsan_atomic##N##_compare_exchange_val(volatile TYPE* a, TYPE c, TYPE v, int, int) {            \
        typedef TYPE T; GPUK_EMU_NOTE(a, ::gpuk_emu::ACC_ATOMIC);                                                       \
        __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return c; }
#define GPUK_EMU_ATOMIC_RMW(N, TYPE, NAME, BUILTIN)                                                                     \
    GPUK_EMU_HOOK TYPE __tsan_atomic##N##_##NAME(volatile TYPE* a, TYPE v, int) {                                       \
        typedef TYPE T; GPUK_EMU_NOTE(a, ::gpuk_emu::ACC_ATOMIC); return BUILTIN(a, v, __ATOMIC_SEQ_CST); }
GPUK_EMU_ATOMICS(8, unsigned char)
GPUK_EMU_ATOMICS(16, unsigned short)
GPUK_EMU_ATOMICS(32, unsigned int)
GPUK_EMU_ATOMICS(64, unsigned long long)
#undef GPUK_EMU_ATOMICS
#undef GPUK_EMU_ATOMIC_RMW
#undef GPUK_EMU_NOTE
#undef GPUK_EMU_HOOK
#endif

extern "C" __attribute__((visibility("default"))) int gpuk_emu_abi_version() { return GPUK_EMU_ABI_VERSION; }
