/* commviz's NCCL profiler plugin: what NCCL itself runs, below Python.
 *
 * NCCL loads this library when NCCL_PROFILER_PLUGIN names its path (the probe sets
 * that before NCCL initializes: commviz/probe/nccl_plugin.py) and calls it from the
 * threads that launch collectives and from its proxy thread. The plugin never blocks
 * them and never allocates on their path: each call writes at most one fixed-size
 * record into a bounded lock-free ring (Vyukov's bounded queue, many writers), and
 * a record that finds the ring full is dropped and counted. The probe's sender thread
 * drains the ring through ctypes (cvz_drain), so NCCL's events leave the rank by the
 * rank's one existing path.
 *
 * This is a plain C library with no Python symbol in it: loaded into a process with
 * no commviz probe (a C++ NCCL app), init sees no reader attached, says so once
 * through NCCL's logger and returns an error, which makes NCCL unload it, so such a
 * process pays nothing.
 *
 * Event handles are slots of fixed pools reused round-robin, never freed: NCCL hands
 * a collective's handle back as the parent of its KernelCh events after it stopped
 * the collective (stopping it means "enqueued"), so a slot must outlive its stop.
 * Collectives captured into a CUDA graph get slots of a pool of their own, reused
 * only after PINNED_SLOTS more captures, since every replay reports through them.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ncclprof_abi.h"

#define EXPORT __attribute__((visibility("default")))

enum { REC_INIT = 1, REC_FINI = 2, REC_START = 3, REC_ENQ = 4, REC_KSTOP = 5 };

/* One record, 128 bytes; commviz/probe/nccl_plugin.py reads it with the same layout. */
typedef struct {
    uint32_t kind;
    uint8_t is_p2p, captured, nchannels, nwarps;
    uint64_t serial; /* the op's serial in this process; 0 for INIT and FINI */
    uint64_t comm;   /* NCCL's commHash */
    int64_t t;       /* CLOCK_MONOTONIC ns, the clock of Python's time.monotonic_ns */
    uint64_t a;      /* START: seqNumber; KSTOP: the GPU timer at the channel's start; INIT: nranks */
    uint64_t b;      /* START: count; KSTOP: the GPU timer at its stop; INIT: nNodes */
    int32_t rank;    /* START, INIT: this rank in the communicator */
    int32_t peer;    /* START: the peer (p2p) or root (collective); KSTOP: the channel */
    char func[16];
    char dtype[16];
    char algo[16];
    char proto[8];
    uint8_t pad_[16];
} cvz_rec;

_Static_assert(sizeof(cvz_rec) == 128, "cvz_rec is 128 bytes");

#define RING_CAP 32768u /* a power of two */
typedef struct {
    _Atomic uint64_t seq;
    cvz_rec rec;
} cell_t;

static cell_t ring[RING_CAP];
static _Atomic uint64_t ring_head; /* next position a writer claims */
static uint64_t ring_tail;         /* the reader's next position (one reader at a time) */
static atomic_flag ring_ready_lock = ATOMIC_FLAG_INIT;
static _Atomic int ring_ready;

/* Counters: cvz_stats' order. */
enum {
    ST_RECORDS, ST_DROPPED, ST_COMMS, ST_COLLS, ST_P2PS, ST_KERNEL_CH, ST_CAPTURED,
    ST_NO_PARENT, ST_REFUSED, ST_VERSION, ST_N
};
static _Atomic uint64_t stats[ST_N];
static _Atomic int attached;
static _Atomic int said_no_reader;

/* ------------------------------------------------------------------ the ring */

static void ring_init(void) {
    if (atomic_load_explicit(&ring_ready, memory_order_acquire)) return;
    while (atomic_flag_test_and_set(&ring_ready_lock)) {
    }
    if (!atomic_load_explicit(&ring_ready, memory_order_relaxed)) {
        for (uint64_t i = 0; i < RING_CAP; i++) atomic_store_explicit(&ring[i].seq, i, memory_order_relaxed);
        atomic_store_explicit(&ring_ready, 1, memory_order_release);
    }
    atomic_flag_clear(&ring_ready_lock);
}

static cvz_rec* ring_claim(uint64_t* pos_out) {
    uint64_t pos = atomic_load_explicit(&ring_head, memory_order_relaxed);
    for (;;) {
        cell_t* c = &ring[pos & (RING_CAP - 1)];
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&ring_head, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                *pos_out = pos;
                return &c->rec;
            }
        } else if (dif < 0) {
            atomic_fetch_add_explicit(&stats[ST_DROPPED], 1, memory_order_relaxed);
            return NULL; /* full: the reader is behind */
        } else {
            pos = atomic_load_explicit(&ring_head, memory_order_relaxed);
        }
    }
}

static void ring_publish(uint64_t pos) {
    atomic_store_explicit(&ring[pos & (RING_CAP - 1)].seq, pos + 1, memory_order_release);
    atomic_fetch_add_explicit(&stats[ST_RECORDS], 1, memory_order_relaxed);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void copy_name(char* dst, size_t n, const char* src) {
    if (src == NULL) {
        dst[0] = 0;
        return;
    }
    size_t i = 0;
    for (; i + 1 < n && src[i]; i++) dst[i] = src[i];
    dst[i] = 0;
}

/* ------------------------------------------------------------------ handles */

enum { H_CTX = 0x43545831, H_API = 0x41504931, H_OP = 0x4f505f31, H_KCH = 0x4b434831 };

typedef struct {
    uint32_t kind;
    uint64_t comm;
    int rank;
} ctx_t;

typedef struct {
    uint32_t kind;
    bool captured;
} api_t;

typedef struct {
    uint32_t kind;
    uint8_t is_p2p, captured, nchannels;
    uint64_t serial;
    uint64_t comm;
} op_t;

typedef struct {
    uint32_t kind;
    uint8_t channel;
    uint64_t serial;
    uint64_t comm;
    uint64_t start;
    uint64_t stop;
} kch_t;

#define API_SLOTS 4096u
#define OP_SLOTS 16384u
#define PINNED_SLOTS 4096u
#define KCH_SLOTS 16384u
static api_t api_pool[API_SLOTS];
static op_t op_pool[OP_SLOTS];
static op_t pinned_pool[PINNED_SLOTS];
static kch_t kch_pool[KCH_SLOTS];
static _Atomic uint64_t api_next, op_next, pinned_next, kch_next, serial_next;

/* ------------------------------------------------------------------ the plugin */

static int mask_for_this_process(void) {
    int mask = NCCLP_COLL | NCCLP_P2P | NCCLP_COLL_API | NCCLP_P2P_API | NCCLP_CE_COLL;
    const char* k = getenv("COMMVIZ_NCCL_KERNEL");
    if (k == NULL || strcmp(k, "0") != 0) mask |= NCCLP_KERNEL_CH;
    return mask;
}

static nccl_result_t plugin_init(void** context, uint64_t commId, int* mask, const char* commName, int nNodes,
                                 int nranks, int rank, nccl_logger_t logfn, int version) {
    *context = NULL;
    if (!atomic_load(&attached)) {
        if (!atomic_exchange(&said_no_reader, 1) && logfn != NULL)
            logfn(NCCL_LOG_INFO_, NCCL_SUBSYS_INIT, __FILE__, __LINE__,
                  "commviz profiler plugin: no commviz probe in this process reads it; unloading");
        atomic_fetch_add(&stats[ST_REFUSED], 1);
        return NCCL_INTERNAL_ERROR;
    }
    ring_init();
    ctx_t* ctx = calloc(1, sizeof(ctx_t));
    if (ctx == NULL) return NCCL_INTERNAL_ERROR;
    ctx->kind = H_CTX;
    ctx->comm = commId;
    ctx->rank = rank;
    *context = ctx;
    if (mask != NULL) *mask = mask_for_this_process();
    atomic_store(&stats[ST_VERSION], (uint64_t)version);
    atomic_fetch_add(&stats[ST_COMMS], 1);
    uint64_t pos;
    cvz_rec* r = ring_claim(&pos);
    if (r != NULL) {
        memset(r, 0, sizeof *r);
        r->kind = REC_INIT;
        r->comm = commId;
        r->t = now_ns();
        r->a = (uint64_t)nranks;
        r->b = (uint64_t)nNodes;
        r->rank = rank;
        r->peer = -1;
        copy_name(r->func, sizeof r->func + sizeof r->dtype + sizeof r->algo + sizeof r->proto, commName);
        ring_publish(pos);
    }
    return NCCL_OK;
}

static nccl_result_t init_v5(void** context, uint64_t commId, int* mask, const char* commName, int nNodes, int nranks,
                             int rank, nccl_logger_t logfn) {
    return plugin_init(context, commId, mask, commName, nNodes, nranks, rank, logfn, 5);
}

static nccl_result_t init_v6(void** context, uint64_t commId, int* mask, const char* commName, int nNodes, int nranks,
                             int rank, nccl_logger_t logfn) {
    return plugin_init(context, commId, mask, commName, nNodes, nranks, rank, logfn, 6);
}

static nccl_result_t plugin_finalize(void* context) {
    ctx_t* ctx = context;
    if (ctx == NULL || ctx->kind != H_CTX) return NCCL_OK;
    uint64_t pos;
    cvz_rec* r = ring_claim(&pos);
    if (r != NULL) {
        memset(r, 0, sizeof *r);
        r->kind = REC_FINI;
        r->comm = ctx->comm;
        r->t = now_ns();
        r->rank = ctx->rank;
        r->peer = -1;
        ring_publish(pos);
    }
    ctx->kind = 0;
    free(ctx);
    return NCCL_OK;
}

static op_t* new_op(ctx_t* ctx, bool captured) {
    op_t* op;
    if (captured) {
        op = &pinned_pool[atomic_fetch_add_explicit(&pinned_next, 1, memory_order_relaxed) % PINNED_SLOTS];
        atomic_fetch_add_explicit(&stats[ST_CAPTURED], 1, memory_order_relaxed);
    } else {
        op = &op_pool[atomic_fetch_add_explicit(&op_next, 1, memory_order_relaxed) % OP_SLOTS];
    }
    op->kind = H_OP;
    op->captured = captured;
    op->comm = ctx->comm;
    op->serial = atomic_fetch_add_explicit(&serial_next, 1, memory_order_relaxed) + 1;
    return op;
}

static nccl_result_t start_op(ctx_t* ctx, void** eHandle, ncclp_descr_t* d, bool is_p2p) {
    api_t* parent = d->parentObj;
    bool captured = false;
    if (parent != NULL && parent->kind == H_API) captured = parent->captured;
    else atomic_fetch_add_explicit(&stats[ST_NO_PARENT], 1, memory_order_relaxed);
    op_t* op = new_op(ctx, captured);
    op->is_p2p = is_p2p;
    op->nchannels = is_p2p ? d->p2p.nChannels : d->coll.nChannels;
    *eHandle = op;
    atomic_fetch_add_explicit(&stats[is_p2p ? ST_P2PS : ST_COLLS], 1, memory_order_relaxed);
    uint64_t pos;
    cvz_rec* r = ring_claim(&pos);
    if (r == NULL) return NCCL_OK;
    memset(r, 0, sizeof *r);
    r->kind = REC_START;
    r->is_p2p = is_p2p;
    r->captured = captured;
    r->nchannels = op->nchannels;
    r->serial = op->serial;
    r->comm = ctx->comm;
    r->t = now_ns();
    r->rank = d->rank;
    if (is_p2p) {
        r->b = d->p2p.count;
        r->peer = d->p2p.peer;
        copy_name(r->func, sizeof r->func, d->p2p.func);
        copy_name(r->dtype, sizeof r->dtype, d->p2p.datatype);
    } else {
        r->a = d->coll.seqNumber;
        r->b = d->coll.count;
        r->peer = d->coll.root;
        r->nwarps = d->coll.nWarps;
        copy_name(r->func, sizeof r->func, d->coll.func);
        copy_name(r->dtype, sizeof r->dtype, d->coll.datatype);
        copy_name(r->algo, sizeof r->algo, d->coll.algo);
        copy_name(r->proto, sizeof r->proto, d->coll.proto);
    }
    ring_publish(pos);
    return NCCL_OK;
}

static nccl_result_t start_ce_coll(ctx_t* ctx, void** eHandle, ncclp_descr_t* d) {
    op_t* op = new_op(ctx, false);
    op->nchannels = 0; /* copy engines: no kernel channel reports its end */
    *eHandle = op;
    atomic_fetch_add_explicit(&stats[ST_COLLS], 1, memory_order_relaxed);
    uint64_t pos;
    cvz_rec* r = ring_claim(&pos);
    if (r == NULL) return NCCL_OK;
    memset(r, 0, sizeof *r);
    r->kind = REC_START;
    r->serial = op->serial;
    r->comm = ctx->comm;
    r->t = now_ns();
    r->rank = d->rank;
    r->a = d->ceColl.seqNumber;
    r->b = d->ceColl.count;
    r->peer = d->ceColl.root;
    copy_name(r->func, sizeof r->func, d->ceColl.func);
    copy_name(r->dtype, sizeof r->dtype, d->ceColl.datatype);
    copy_name(r->algo, sizeof r->algo, "CE");
    ring_publish(pos);
    return NCCL_OK;
}

static nccl_result_t plugin_start(void* context, void** eHandle, ncclp_descr_t* d) {
    *eHandle = NULL;
    ctx_t* ctx = context;
    if (ctx == NULL || ctx->kind != H_CTX || d == NULL) return NCCL_OK;
    switch (d->type) {
    case NCCLP_COLL_API:
    case NCCLP_P2P_API: {
        api_t* a = &api_pool[atomic_fetch_add_explicit(&api_next, 1, memory_order_relaxed) % API_SLOTS];
        a->kind = H_API;
        a->captured = d->type == NCCLP_COLL_API ? d->collApi.graphCaptured : d->p2pApi.graphCaptured;
        *eHandle = a;
        return NCCL_OK;
    }
    case NCCLP_COLL:
        return start_op(ctx, eHandle, d, false);
    case NCCLP_P2P:
        return start_op(ctx, eHandle, d, true);
    case NCCLP_CE_COLL:
        return start_ce_coll(ctx, eHandle, d);
    case NCCLP_KERNEL_CH: {
        op_t* parent = d->parentObj;
        if (parent == NULL || parent->kind != H_OP) return NCCL_OK;
        kch_t* k = &kch_pool[atomic_fetch_add_explicit(&kch_next, 1, memory_order_relaxed) % KCH_SLOTS];
        k->kind = H_KCH;
        k->channel = d->kernelCh.channelId;
        k->serial = parent->serial;
        k->comm = parent->comm;
        k->start = d->kernelCh.pTimer;
        k->stop = 0;
        *eHandle = k;
        return NCCL_OK;
    }
    default:
        return NCCL_OK;
    }
}

static nccl_result_t plugin_state(void* eHandle, int state, ncclp_state_args_t* args) {
    kch_t* k = eHandle;
    if (k != NULL && k->kind == H_KCH && state == NCCLP_STATE_KERNEL_CH_STOP && args != NULL)
        k->stop = args->kernelCh.pTimer;
    return NCCL_OK;
}

static nccl_result_t plugin_stop(void* eHandle) {
    uint32_t kind = eHandle == NULL ? 0 : *(uint32_t*)eHandle;
    uint64_t pos;
    cvz_rec* r;
    if (kind == H_OP) {
        op_t* op = eHandle;
        if ((r = ring_claim(&pos)) == NULL) return NCCL_OK;
        memset(r, 0, sizeof *r);
        r->kind = REC_ENQ;
        r->is_p2p = op->is_p2p;
        r->captured = op->captured;
        r->nchannels = op->nchannels;
        r->serial = op->serial;
        r->comm = op->comm;
        r->t = now_ns();
        r->peer = -1;
        ring_publish(pos);
    } else if (kind == H_KCH) {
        kch_t* k = eHandle;
        atomic_fetch_add_explicit(&stats[ST_KERNEL_CH], 1, memory_order_relaxed);
        if ((r = ring_claim(&pos)) == NULL) return NCCL_OK;
        memset(r, 0, sizeof *r);
        r->kind = REC_KSTOP;
        r->serial = k->serial;
        r->comm = k->comm;
        r->t = now_ns();
        r->a = k->start;
        r->b = k->stop;
        r->peer = k->channel;
        ring_publish(pos);
    }
    return NCCL_OK;
}

EXPORT const ncclp_profiler_t ncclProfiler_v6 = {"commviz", init_v6, plugin_start, plugin_stop, plugin_state,
                                                 plugin_finalize};
EXPORT const ncclp_profiler_t ncclProfiler_v5 = {"commviz", init_v5, plugin_start, plugin_stop, plugin_state,
                                                 plugin_finalize};

/* ------------------------------------------------------------------ the reader's side */

/* Called by the probe before NCCL initializes: a reader is here, so init says yes. */
EXPORT int cvz_attach(void) {
    ring_init();
    atomic_store(&attached, 1);
    return (int)sizeof(cvz_rec);
}

/* Copy up to `max` records into `out`; returns how many. One reader at a time
 * (the probe's sender thread, under its own lock). */
EXPORT int cvz_drain(cvz_rec* out, int max) {
    if (!atomic_load_explicit(&ring_ready, memory_order_acquire)) return 0;
    int n = 0;
    while (n < max) {
        cell_t* c = &ring[ring_tail & (RING_CAP - 1)];
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        if (seq != ring_tail + 1) break; /* empty, or a writer is mid-record */
        out[n++] = c->rec;
        atomic_store_explicit(&c->seq, ring_tail + RING_CAP, memory_order_release);
        ring_tail++;
    }
    return n;
}

EXPORT int cvz_stats(uint64_t* out, int n) {
    int i = 0;
    for (; i < n && i < ST_N; i++) out[i] = atomic_load(&stats[i]);
    return i;
}

EXPORT int cvz_ring_capacity(void) { return (int)RING_CAP; }

/* Where this build put the descriptor's fields: the test compares them with the
 * layout NCCL documents, worked out independently with ctypes. */
EXPORT int cvz_abi_offsets(int64_t* out, int n) {
    int64_t v[] = {
        (int64_t)sizeof(ncclp_descr_t),
        (int64_t)offsetof(ncclp_descr_t, rank),
        (int64_t)offsetof(ncclp_descr_t, coll.seqNumber),
        (int64_t)offsetof(ncclp_descr_t, coll.count),
        (int64_t)offsetof(ncclp_descr_t, coll.nChannels),
        (int64_t)offsetof(ncclp_descr_t, coll.algo),
        (int64_t)offsetof(ncclp_descr_t, p2p.peer),
        (int64_t)offsetof(ncclp_descr_t, p2p.nChannels),
        (int64_t)offsetof(ncclp_descr_t, collApi.graphCaptured),
        (int64_t)offsetof(ncclp_descr_t, p2pApi.graphCaptured),
        (int64_t)offsetof(ncclp_descr_t, kernelCh.pTimer),
        (int64_t)offsetof(ncclp_profiler_t, finalize),
    };
    int k = (int)(sizeof v / sizeof v[0]);
    for (int i = 0; i < n && i < k; i++) out[i] = v[i];
    return k;
}
