"""What commviz's NCCL profiler plugin costs NCCL's threads, measured without NCCL.

A small C driver (compiled here with the system's cc) loads the built plugin by
path, as NCCL does, and makes NCCL's calls for an op (the API event, the task event,
both stops: the calling thread's share) and for each of its channels' kernel events
(the proxy thread's share), `--ops` times, while a second thread drains the ring as
the probe's sender does. It prints ns per op for each side, with and without a
reader draining (a full ring drops and counts: that path is timed too). One JSON line.

    python bench/ncclprof_cost.py [--ops 2000000] [--channels 2]

The figure is the plugin's own work, not NCCL's cost of calling a plugin; the GPU
check (bench/gpu_check.sh) measures a whole launch with and without it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

DRIVER = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ncclprof_abi.h"

static ncclp_profiler_t* P;
static int (*drain)(void*, int);
static atomic_int stop;
static char buf[4096 * 128];

static void* drainer(void* arg) {
    (void)arg;
    while (!atomic_load(&stop)) drain(buf, 4096);
    return NULL;
}

static double now(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void run(void* ctx, long ops, int channels, double* caller_ns, double* proxy_ns) {
    double tc = 0, tp = 0;
    for (long i = 0; i < ops; i++) {
        ncclp_descr_t api = {0}, task = {0}, k = {0};
        void *ha, *ht, *hk;
        double t0 = now();
        api.type = NCCLP_COLL_API; api.collApi.func = "AllReduce"; api.collApi.count = 1024;
        api.collApi.datatype = "ncclFloat32";
        P->startEvent(ctx, &ha, &api);
        task.type = NCCLP_COLL; task.parentObj = ha; task.coll.seqNumber = i; task.coll.func = "AllReduce";
        task.coll.count = 1024; task.coll.datatype = "ncclFloat32"; task.coll.nChannels = channels;
        task.coll.algo = "RING"; task.coll.proto = "SIMPLE";
        P->startEvent(ctx, &ht, &task);
        P->stopEvent(ha);
        P->stopEvent(ht);
        double t1 = now();
        for (int c = 0; c < channels; c++) {
            k.type = NCCLP_KERNEL_CH; k.parentObj = ht; k.kernelCh.channelId = c; k.kernelCh.pTimer = i;
            P->startEvent(ctx, &hk, &k);
            ncclp_state_args_t a = {0}; a.kernelCh.pTimer = i + 100;
            P->recordEventState(hk, NCCLP_STATE_KERNEL_CH_STOP, &a);
            P->stopEvent(hk);
        }
        double t2 = now();
        tc += t1 - t0; tp += t2 - t1;
    }
    *caller_ns = tc / ops; *proxy_ns = tp / ops;
}

int main(int argc, char** argv) {
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    long ops = atol(argv[2]); int channels = atoi(argv[3]);
    P = dlsym(lib, "ncclProfiler_v5");
    drain = dlsym(lib, "cvz_drain");
    int (*attach)(void) = dlsym(lib, "cvz_attach");
    int (*stats)(uint64_t*, int) = dlsym(lib, "cvz_stats");
    attach();
    void* ctx; int mask = 0;
    if (P->init(&ctx, 42, &mask, NULL, 1, 2, 0, NULL) != 0) return 3;
    /* calls an empty timed region costs, taken off both sides */
    double e0 = now(); for (int i = 0; i < 1000000; i++) { double a = now(); (void)a; } double e = (now() - e0) / 1e6;
    pthread_t th; pthread_create(&th, NULL, drainer, NULL);
    double c1, p1, c2, p2;
    run(ctx, ops, channels, &c1, &p1);
    atomic_store(&stop, 1); pthread_join(th, NULL);
    uint64_t s0[2]; stats(s0, 2);
    run(ctx, ops, channels, &c2, &p2);  /* nobody drains: the ring is full at once */
    uint64_t s1[2]; stats(s1, 2);
    printf("{\"caller_ns\": %.1f, \"proxy_ns\": %.1f, \"caller_ns_ring_full\": %.1f, \"proxy_ns_ring_full\": %.1f, "
           "\"clock_read_ns\": %.1f, \"dropped_while_drained\": %llu, \"dropped_undrained\": %llu}\n",
           c1 - e, p1 - e, c2 - e, p2 - e, e, (unsigned long long)s0[1], (unsigned long long)(s1[1] - s0[1]));
    return 0;
}
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=2_000_000)
    ap.add_argument("--channels", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from commviz import native
    from commviz.probe import nccl_plugin

    lib = native.library(nccl_plugin.PART)
    if lib is None:
        print(json.dumps({"error": "the plugin is not built: pip install -e ."}))
        return 2
    here = os.path.dirname(os.path.abspath(nccl_plugin.__file__))
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "drive.c"), os.path.join(d, "drive")
        with open(src, "w") as f:
            f.write(DRIVER)
        subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", f"-I{here}", src, "-o", exe, "-ldl", "-lpthread"],
                       check=True)
        out = subprocess.run([exe, lib, str(args.ops), str(args.channels)], check=True, capture_output=True,
                             text=True).stdout
    doc = json.loads(out)
    doc.update(ops=args.ops, channels=args.channels)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
