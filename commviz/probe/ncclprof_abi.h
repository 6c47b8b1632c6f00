/* NCCL's profiler plugin ABI, versions 5 and 6, as commviz's plugin uses it.
 *
 * Written from NCCL's plugin documentation (plugins/profiler/README.md and the
 * example's profiler_v5.h / profiler_v6.h, NCCL 2.28-2.29), so that building the
 * plugin needs no NCCL and no CUDA. Only the layout matters: the names are ours.
 *
 * v6 (NCCL 2.29) extends v5's descriptor union with copy-engine members; every v5
 * member sits at the same offset in both, so one implementation reads either.
 */
#ifndef COMMVIZ_NCCLPROF_ABI_H
#define COMMVIZ_NCCLPROF_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef int nccl_result_t; /* ncclResult_t: 0 is ncclSuccess, 5 ncclInternalError */
#define NCCL_OK 0
#define NCCL_INTERNAL_ERROR 3

/* ncclDebugLogLevel and the subsystem flag NCCL_INIT */
enum { NCCL_LOG_WARN_ = 2, NCCL_LOG_INFO_ = 3 };
#define NCCL_SUBSYS_INIT 0x1UL
#define NCCL_SUBSYS_PROFILE 0x4000UL
typedef void (*nccl_logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

/* Event types (the activation mask's bits) */
enum {
    NCCLP_GROUP = 1 << 0,
    NCCLP_COLL = 1 << 1,
    NCCLP_P2P = 1 << 2,
    NCCLP_PROXY_OP = 1 << 3,
    NCCLP_PROXY_STEP = 1 << 4,
    NCCLP_PROXY_CTRL = 1 << 5,
    NCCLP_KERNEL_CH = 1 << 6,
    NCCLP_NET_PLUGIN = 1 << 7,
    NCCLP_GROUP_API = 1 << 8,
    NCCLP_COLL_API = 1 << 9,
    NCCLP_P2P_API = 1 << 10,
    NCCLP_KERNEL_LAUNCH = 1 << 11,
    NCCLP_CE_COLL = 1 << 12, /* v6 */
    NCCLP_CE_SYNC = 1 << 13,
    NCCLP_CE_BATCH = 1 << 14,
};

/* The states recordEventState reports that the plugin reads */
enum { NCCLP_STATE_KERNEL_CH_STOP = 22 };

typedef struct {
    uint64_t type;
    void* parentObj;
    int rank;
    union {
        struct { bool graphCaptured; int groupDepth; } groupApi;
        struct { const char* func; size_t count; const char* datatype; int root; void* stream; bool graphCaptured; } collApi;
        struct { const char* func; size_t count; const char* datatype; void* stream; bool graphCaptured; } p2pApi;
        struct { void* stream; } kernelLaunch;
        struct {
            uint64_t seqNumber;
            const char* func;
            void const* sendBuff;
            void* recvBuff;
            size_t count;
            int root;
            const char* datatype;
            uint8_t nChannels;
            uint8_t nWarps;
            const char* algo;
            const char* proto;
            void* parentGroup;
        } coll;
        struct {
            const char* func;
            void* buff;
            const char* datatype;
            size_t count;
            int peer;
            uint8_t nChannels;
            void* parentGroup;
        } p2p;
        struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
        struct { int step; } proxyStep;
        struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
        struct { int64_t id; void* data; } netPlugin;
        /* v6 only */
        struct {
            uint64_t seqNumber;
            const char* func;
            void const* sendBuff;
            void* recvBuff;
            size_t count;
            int root;
            const char* datatype;
            const char* syncStrategy;
            bool intraBatchSync;
            uint32_t batchSize;
            uint32_t numBatches;
            uint32_t ceSeqNum;
            void* stream;
        } ceColl;
    };
} ncclp_descr_t;

typedef union {
    struct { size_t transSize; } proxyStep;
    struct { int appendedProxyOps; } proxyCtrl;
    struct { void* data; } netPlugin;
    struct { uint64_t pTimer; } kernelCh;
} ncclp_state_args_t;

typedef struct {
    const char* name;
    nccl_result_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                          int nranks, int rank, nccl_logger_t logfn);
    nccl_result_t (*startEvent)(void* context, void** eHandle, ncclp_descr_t* eDescr);
    nccl_result_t (*stopEvent)(void* eHandle);
    nccl_result_t (*recordEventState)(void* eHandle, int eState, ncclp_state_args_t* eStateArgs);
    nccl_result_t (*finalize)(void* context);
} ncclp_profiler_t;

#endif
