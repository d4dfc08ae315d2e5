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
#define GPUK_EMU_ABI_VERSION 1
extern "C" {
struct gpuk_emu_arg { void* host; uint64_t nbytes; uint32_t itemsize; uint32_t flags; int32_t alias_of; int32_t pad; };
struct gpuk_emu_config {
    uint32_t grid[3], block[3];
    uint64_t shared_mem;
    uint32_t host_threads, reverse_order;
    uint64_t stack_bytes;
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
enum { SHARED_ARG = -2 };   // arg_index reported for dynamic shared memory
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

struct Region { char* map; size_t map_len; char* data; uint64_t nbytes; bool readonly; };

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

// ---- __syncthreads ----
inline void sync_block_impl(int predicate, int* count) {
    Worker* w = t_worker;
    Fiber* f = static_cast<Fiber*>(t_thread);
    const unsigned gen = w->bar_gen;
    w->bar_acc += predicate != 0;
    f->state = F_WAIT_BLOCK;
    w->progress = true;
    if (++w->bar_arrived == w->nthreads) {
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
    "mma_m16n8k8_tf32", "mma_m16n8k16_f16", "mma_m16n8k16_bf16"};

// Run by the last lane of `mask` to arrive: computes every lane's result.
inline void complete_warp_op(Fiber* lanes, unsigned mask, int op) {
    for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l) & 1u && lanes[l].op->op != op)
            fail_in_fiber(ERR_BAD_COLLECTIVE, "%s met %s of lane %u in one warp collective (mask 0x%08x)",
                          kWarpOpNames[op], kWarpOpNames[lanes[l].op->op], l, mask);
    if (op >= OP_MMA_TF32) {
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
        char tail[96];
        snprintf(tail, sizeof tail, "; first collective mask 0x%08x", first_mask);
        strncat(w->err.message, tail, sizeof w->err.message - strlen(w->err.message) - 1);
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
    return true;
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
        sigaltstack(&alt, &old_alt);
        if (sigsetjmp(w->jmp, 1) == 0) {
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
    if (w->stacks) munmap(w->stacks, w->stacks_len);
    if (w->smem_map) munmap(w->smem_map, w->smem_len);
    free(w->fibers);
    free(alt.ss_sp);
    t_worker = nullptr;
    return nullptr;
}

inline bool check_config(const gpuk_emu_config* c, gpuk_emu_error* e) {
    const uint64_t threads = uint64_t(c->block[0]) * c->block[1] * c->block[2];
    if (threads == 0 || threads > 1024 || c->block[2] > 64 || c->grid[0] == 0 || c->grid[1] == 0 ||
        c->grid[2] == 0 || c->grid[1] > 65535 || c->grid[2] > 65535 || c->grid[0] > 0x7fffffffu) {
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
        unsigned nworkers = cfg->host_threads ? cfg->host_threads : 1;
        if (nworkers > L.nblocks) nworkers = L.nblocks;
        if (nworkers > 64) nworkers = 64;
        Worker* workers = static_cast<Worker*>(calloc(nworkers, sizeof(Worker)));
        pthread_t tids[64];
        install_handlers();
        for (unsigned k = 0; k < nworkers; ++k) workers[k].launch = &L;
        for (unsigned k = 1; k < nworkers; ++k) pthread_create(&tids[k], nullptr, &worker_main, &workers[k]);
        worker_main(&workers[0]);
        for (unsigned k = 1; k < nworkers; ++k) pthread_join(tids[k], nullptr);
        restore_handlers();
        free(workers);
        pthread_mutex_destroy(&L.error_lock);
        status = L.failed;
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

extern "C" __attribute__((visibility("default"))) int gpuk_emu_abi_version() { return GPUK_EMU_ABI_VERSION; }
