/* The common path of the probe's fast wrapper (commviz/probe/patch.py, _fast_wrapper)
 * in C: the per-op cost every user pays.
 *
 * A FastWrapper holds what _fast_wrapper precomputes at patch time. Its call handles
 * only the common case: positional arguments, not nested, the probe started, CUDA
 * not initialised, a plain torch.Tensor, a known group (or the default one), a p2p
 * peer given, the reduce op absent or the default object, and with the crash ring on
 * a dtype of the known ones. Any
 * other call goes, before anything is changed, to the Python wrapper (`slow`) with the
 * same arguments, which does what it always did; but a call nested in another wrapped
 * call whose bytes are not its children's (send's isend) goes straight to torch's
 * function, keywords and all, as the Python wrapper would send it.
 *
 * In the common case it does what the Python code does, in the same order: the
 * sequence number, next(ids), the clock (CLOCK_MONOTONIC, as time.monotonic_ns), the
 * deferred start list (with the crash ring on: its bytes, dtype name and shape read
 * here, and ring_start(op_id, start) after the append; ring_end(op_id, t1) after the
 * end), the append (or health.dropped += 1), depth 1, the call; on an exception depth
 * 0, _failed(probe, name, op_id, exc) and the same exception raised again; else depth
 * 0 and either the end (a blocking op, not coalesced: its time folded into the start
 * while no drain has taken it, else the END tuple) or the Python
 * `complete(op_id, t0, peer, g, result)`. A C-API failure after the sequence
 * number was taken runs the call unrecorded through Python's `_unprobed`.
 *
 * The module's `drain` is the sender thread's loop over what it popped (below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *orig, *slow, *probe, *tls, *name, *queue, *append, *ids, *groups, *health;
    PyObject *seq_key, *red_default, *red_default_name, *start_c, *end_c, *cuda, *tensor_type;
    PyObject *failed, *complete, *unprobed, *dtypes;
    PyObject *probe_dict, *cuda_dict, *group_type; /* read directly: see fw_new */
    PyGetSetDef *get_nbytes, *get_dtype, *get_shape; /* torch's getters of Tensor's fields (see tensor_field) */
    unsigned int tensor_version; /* the Tensor type's version tag when they were found */
    Py_ssize_t off_pg, off_seq, off_gid, off_p2p_seq; /* GroupInfo's slots */
    PyObject *st_cached; /* tls.s of the thread that called last (a thread's list is never replaced) */
    PyCFunction append_c; /* the queue's append and length, called directly (see fw_new) */
    lenfunc len_c;
    uint64_t st_tid;
    /* probe.started, .ring_start, .ring_end, .default_group and torch.cuda._initialized
       as last read (borrowed: their dicts hold them), and those dicts' version tags
       then; see fresh() */
    PyObject *v_started, *v_ring, *v_ring_end, *v_default_group, *v_cuda_init;
    PyObject *last_dt, *last_dtname; /* the dtype the ring named last, and its name (held) */
    uint64_t dtypes_ver;
    uint64_t probe_ver, cuda_ver;
    int probe_read, cuda_read;
    Py_ssize_t cap, bi, gi, ai, ri, pi;
    int p2p, always_async, seq_dir, fold;
    unsigned long long fast_calls, slow_calls, nested_calls;
} FastWrapper;

static PyObject *s_ring_end, *s_nbytes, *s_dtype, *s_shape, *s_clear;
static PyObject *s_s, *s_started, *s_ring_start, *s_initialized, *s_default_group, *s_pg, *s_seq, *s_p2p_seq,
    *s_gid, *s_dropped, *s_empty, *s_empty_tuple, *i_minus1, *i_0, *i_1;

#define DEPTH 0
#define COALESCED 3
#define START_LEN 13 /* a start record's items (events.py); a folded one has its end's time after them */

/* drain() calls so far: a start still queued when the count is what it was at its
   push has not been drained, so its end may be folded into it (see fw_vectorcall) */
static unsigned long long drains;
/* the tag a folded op's record carries instead of START (events.FOLDED, compared by
   identity: no record from elsewhere can hold it); NULL: no folding */
static PyObject *fold_tag;

/* The crash ring's reads of a tensor's fields (torch's three getters, ~1,100
   instructions), kept for the tensors seen since the last drain, as the drain keeps
   its reads of deferred starts: a tensor's fields are read once per batch either way.
   So a tensor resized in place (resize_, set_) between two ops of one flush interval
   is named, in the ring and on the wire, by its fields when first seen in it (with
   the ring off, by its fields when the drain reads them: its last). An entry holds
   while Tensor's type is as it was (a field redefined on it is read again). A few
   entries, found by address; an entry holds its tensor, so the address stands for
   it. They are let go when a drain has run since (at the next wrapped call, or by
   the drain itself), so a tensor is held a flush interval at most, as a queued start
   holds it; a slot taken by another tensor is not replaced until then, so nothing is
   freed in the middle of a call. */
#define SEEN 4
typedef struct {
    PyObject *x, *nbytes, *dtname, *shape; /* held */
    unsigned int version; /* Tensor's type version tag when they were read: a field redefined since is read again */
} Seen;
static Seen seen[SEEN];
static unsigned long long seen_drains; /* the drain count the entries were read under */

/* let the entries go once a drain has run since they were read: freeing a tensor may
   run Python (a weakref's callback), so the table is emptied first */
static void forget_seen(void) {
    if (seen_drains == drains) return;
    seen_drains = drains;
    Seen old[SEEN];
    memcpy(old, seen, sizeof seen);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < SEEN; i++) {
        Py_XDECREF(old[i].x);
        Py_XDECREF(old[i].nbytes);
        Py_XDECREF(old[i].dtname);
        Py_XDECREF(old[i].shape);
    }
}

/* a drain (or a take) has begun: what it took is not folded into, and the ring's
   reads made before it are let go */
static void drained(void) {
    drains++;
    forget_seen();
}

static inline Seen *seen_slot(PyObject *x) { return &seen[((uintptr_t)x >> 6) % SEEN]; }

/* a list that is a folded op's record */
static inline int folded(PyObject *rec) {
    return fold_tag != NULL && PyList_GET_SIZE(rec) == START_LEN + 1 && PyList_GET_ITEM(rec, 0) == fold_tag;
}

static PyObject *mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
}

static PyObject *call_slow(FastWrapper *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    self->slow_calls++;
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

/* a GroupInfo's __slots__ member, by its offset (the type was checked) */
#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static PyObject *slot_get(PyObject *o, Py_ssize_t off, PyObject *name) {
    PyObject *v = SLOT(o, off);
    if (v == NULL) {
        PyErr_SetObject(PyExc_AttributeError, name);
        return NULL;
    }
    Py_INCREF(v);
    return v;
}

/* health.dropped += 1; 0 or -1 */
static int count_dropped(FastWrapper *self) {
    PyObject *d = PyObject_GetAttr(self->health, s_dropped);
    if (d == NULL) return -1;
    PyObject *d1 = PyNumber_Add(d, i_1);
    Py_DECREF(d);
    if (d1 == NULL) return -1;
    int r = PyObject_SetAttr(self->health, s_dropped, d1);
    Py_DECREF(d1);
    return r;
}

/* append rec if len(queue) < cap (1), else count it dropped (0); -1 on error */
static int push(FastWrapper *self, PyObject *rec) {
    Py_ssize_t n = self->len_c != NULL ? self->len_c(self->queue) : PyObject_Size(self->queue);
    if (n < 0) return -1;
    if (n < self->cap) {
        PyObject *r = self->append_c != NULL ? self->append_c(self->queue, rec) : PyObject_CallOneArg(self->append, rec);
        if (r == NULL) return -1;
        Py_DECREF(r);
        return 1;
    }
    return count_dropped(self);
}

/* st[DEPTH] = v, with any exception in flight kept */
static void set_depth(PyObject *st, PyObject *v) {
    if (PyList_GET_SIZE(st) > DEPTH) {
        Py_INCREF(v);
        PyObject *old = PyList_GET_ITEM(st, DEPTH);
        PyList_SET_ITEM(st, DEPTH, v);
        Py_DECREF(old);
    }
}

/* A dict's version tag: on 3.11 every change to a dict gives it a new one (PEP 509),
   so the five attributes read from two dicts on every call (~450 instructions of
   lookups) are read again only when one changed; elsewhere (3.12 deprecated the tag)
   there is none, and they are always read again. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define DICT_TAGS 1
#define VERSION_OF(d) (((PyDictObject *)(d))->ma_version_tag)
#else
#define DICT_TAGS 0
#define VERSION_OF(d) ((uint64_t)0)
#endif

static inline uint64_t version_of(PyObject *d) { return VERSION_OF(d); }

/* 1 if dict d is as it was when it was read (`read`) and its tag was ver */
static inline int fresh(PyObject *d, uint64_t ver, int read) { return DICT_TAGS && read && version_of(d) == ver; }

/* the probe's four attributes from its dict, borrowed; 0, or -1 with an error set
   (a missing one is NULL, not an error: the call goes to Python as before) */
static int read_probe(FastWrapper *self) {
    PyObject *d = self->probe_dict;
    self->probe_read = 0;
    uint64_t ver = version_of(d);
    if ((self->v_started = PyDict_GetItemWithError(d, s_started)) == NULL && PyErr_Occurred()) return -1;
    if ((self->v_ring = PyDict_GetItemWithError(d, s_ring_start)) == NULL && PyErr_Occurred()) return -1;
    if ((self->v_ring_end = PyDict_GetItemWithError(d, s_ring_end)) == NULL && PyErr_Occurred()) return -1;
    if ((self->v_default_group = PyDict_GetItemWithError(d, s_default_group)) == NULL && PyErr_Occurred()) return -1;
    self->probe_ver = ver;
    self->probe_read = 1;
    return 0;
}

/* x.<name> for an exact torch.Tensor x: torch's getter called as it is, while the
   type is as it was when the getter was found (its version tag: any change to the
   type or its bases gives a new one), else the attribute looked up as Python does.
   PyObject_GetAttr costs ~100 instructions more per field. */
static inline PyObject *tensor_field(FastWrapper *self, PyObject *x, PyGetSetDef *get, PyObject *name) {
    PyTypeObject *t = Py_TYPE(x);
    if (get != NULL && t->tp_version_tag == self->tensor_version && PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG))
        return get->get(x, get->closure);
    return PyObject_GetAttr(x, name);
}

/* 1: true, 0: false, -1: not one we read without running user code */
static int plain_truth(PyObject *o) {
    if (o == Py_True) return 1;
    if (o == Py_False || o == Py_None) return 0;
    if (PyLong_CheckExact(o)) return PyObject_IsTrue(o); /* an exact int runs no user code (and Py_SIZE is
                                                          not its sign from Python 3.12 on) */
    return -1;
}

/* x's bytes, its dtype's name and its shape for the ring (new references): from its
   entry in `seen` where it was read since the last drain, else read now (torch's
   getters) and kept there if its slot is free. 0; or -1 (an error set, or a dtype
   with no name we know: Python names it), with nothing held. */
static int ring_fields(FastWrapper *self, PyObject *x, PyObject **nbytes, PyObject **dtname, PyObject **shape) {
    Seen *e = seen_slot(x);
    if (e->x == x && Py_TYPE(x)->tp_version_tag == e->version &&
        PyType_HasFeature(Py_TYPE(x), Py_TPFLAGS_VALID_VERSION_TAG)) { /* read since the last drain */
        Py_INCREF(e->nbytes);
        Py_INCREF(e->dtname);
        Py_INCREF(e->shape);
        *nbytes = e->nbytes;
        *dtname = e->dtname;
        *shape = e->shape;
        return 0;
    }
    unsigned long long read_under = drains; /* a read through Python (a redefined field) may let a drain run */
    PyObject *nb = tensor_field(self, x, self->get_nbytes, s_nbytes), *name = NULL, *sh;
    if (nb == NULL) return -1;
    PyObject *dt = tensor_field(self, x, self->get_dtype, s_dtype);
    if (dt == NULL) goto fail;
    if (dt == self->last_dt && fresh(self->dtypes, self->dtypes_ver, 1)) {
        name = self->last_dtname; /* the dtype named last, the names unchanged since */
    } else {
        name = PyDict_GetItemWithError(self->dtypes, dt); /* borrowed */
        if (name != NULL) {
            Py_INCREF(dt);
            Py_XSETREF(self->last_dt, dt);
            Py_INCREF(name);
            Py_XSETREF(self->last_dtname, name);
            self->dtypes_ver = version_of(self->dtypes);
        }
    }
    Py_DECREF(dt);
    if (name == NULL || !PyUnicode_CheckExact(name) || PyUnicode_GET_LENGTH(name) == 0) {
        name = NULL;
        goto fail; /* a dtype without a known name: Python names it */
    }
    Py_INCREF(name);
    if ((sh = tensor_field(self, x, self->get_shape, s_shape)) == NULL) goto fail;
    if (e->x == NULL && read_under == drains && PyType_HasFeature(Py_TYPE(x), Py_TPFLAGS_VALID_VERSION_TAG)) {
        e->version = Py_TYPE(x)->tp_version_tag;
        Py_INCREF(x);
        Py_INCREF(nb);
        Py_INCREF(name);
        Py_INCREF(sh);
        e->x = x;
        e->nbytes = nb;
        e->dtname = name;
        e->shape = sh;
    }
    *nbytes = nb;
    *dtname = name;
    *shape = sh;
    return 0;
fail:
    Py_DECREF(nb);
    Py_XDECREF(name);
    return -1;
}

static PyObject *fw_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    FastWrapper *self = (FastWrapper *)callable;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    forget_seen(); /* before anything is read: it may run Python */

    /* ---- checks: nothing is changed before the last of them */
    PyObject *st;
    uint64_t tid = PyThreadState_GetID(PyThreadState_Get());
    if (self->st_cached != NULL && self->st_tid == tid) {
        st = self->st_cached;
        Py_INCREF(st);
    } else {
        st = PyObject_GetAttr(self->tls, s_s);
        if (st == NULL) {
            PyErr_Clear(); /* this thread's first wrapped call: Python makes its state */
            return call_slow(self, args, nargsf, kwnames);
        }
        Py_INCREF(st);
        Py_XSETREF(self->st_cached, st);
        self->st_tid = tid;
    }
    if (!PyList_CheckExact(st) || PyList_GET_SIZE(st) < 4) {
        Py_DECREF(st); /* a state we do not know: Python */
        return call_slow(self, args, nargsf, kwnames);
    }
    if (PyList_GET_ITEM(st, DEPTH) != i_0) {
        PyObject *depth = PyList_GET_ITEM(st, DEPTH);
        long d = PyLong_CheckExact(depth) ? PyLong_AsLong(depth) : 0;
        if (d == -1 && PyErr_Occurred()) PyErr_Clear(); /* past a long: Python's to say */
        if (d > 0 && PyList_GET_ITEM(st, 1) == Py_False) {
            /* inside another wrapped call whose bytes are not its children's (send's
               isend): not an event, torch's function straight away, as Python does */
            Py_DECREF(st);
            self->nested_calls++;
            return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
        }
        Py_DECREF(st); /* nested in an object collective (its bytes are ours to add): Python */
        return call_slow(self, args, nargsf, kwnames);
    }
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        Py_DECREF(st); /* keywords: Python */
        return call_slow(self, args, nargsf, kwnames);
    }
    PyObject *g = NULL, *peer = NULL;
    PyObject *ring_b, *ring = NULL, *nbytes = NULL, *dtname = NULL, *shape = NULL; /* the crash ring's */
    int is_async, going_up = 0;
    /* probe.started, probe.ring_start, torch.cuda._initialized: plain attributes
       (fw_new checked no descriptor of those names), read from the objects' dicts
       when one of them changed since the last read (fresh) */
    if (!fresh(self->probe_dict, self->probe_ver, self->probe_read) && read_probe(self) < 0) goto slow_clear;
    if (self->v_started != Py_True) goto slow;
    ring_b = self->v_ring; /* borrowed */
    if (ring_b == NULL) goto slow;
    if (!fresh(self->cuda_dict, self->cuda_ver, self->cuda_read)) {
        self->cuda_read = 0;
        self->cuda_ver = version_of(self->cuda_dict);
        if ((self->v_cuda_init = PyDict_GetItemWithError(self->cuda_dict, s_initialized)) == NULL) goto slow_clear;
        self->cuda_read = 1;
    }
    if (self->v_cuda_init != Py_False) goto slow;
    if (self->bi >= n) goto slow;
    PyObject *x = args[self->bi];
    if (Py_TYPE(x) != (PyTypeObject *)self->tensor_type) goto slow;
    PyObject *group = n > self->gi ? args[self->gi] : Py_None;
    if (self->p2p) {
        peer = n > self->pi ? args[self->pi] : Py_None;
        if (peer == Py_None) goto slow;
    } else {
        peer = i_minus1;
    }
    if (self->always_async) {
        is_async = 1;
    } else if (n > self->ai) {
        is_async = plain_truth(args[self->ai]);
        if (is_async < 0) goto slow;
    } else {
        is_async = 0;
    }
    if (n > self->ri && args[self->ri] != self->red_default) goto slow;
    if (group == Py_None) {
        g = self->v_default_group; /* borrowed */
        if (g == NULL || g == Py_None) {
            g = NULL;
            goto slow;
        }
        Py_INCREF(g);
        if (Py_TYPE(g) != (PyTypeObject *)self->group_type) goto slow;
    } else {
        PyObject *key = PyLong_FromVoidPtr(group);
        if (key == NULL) goto slow_clear;
        g = PyDict_GetItemWithError(self->groups, key); /* borrowed */
        Py_DECREF(key);
        if (g == NULL) {
            if (PyErr_Occurred()) goto slow_clear;
            goto slow;
        }
        Py_INCREF(g);
        if (Py_TYPE(g) != (PyTypeObject *)self->group_type || SLOT(g, self->off_pg) != group) goto slow;
    }
    if (ring_b != Py_None) { /* the ring needs the start now, as Python builds it: read before anything changes */
        ring = ring_b;
        Py_INCREF(ring); /* the writer this call began with, as in Python (shutdown may swap it) */
        if (ring_fields(self, x, &nbytes, &dtname, &shape) < 0) goto slow_clear;
    }
    Py_INCREF(peer);

    /* ---- the record: from here a failure runs the call unrecorded */
    PyObject *seq = NULL, *op_id = NULL, *t0 = NULL, *start = NULL, *result;
    if (self->p2p) {
        PyObject *pair = slot_get(g, self->off_p2p_seq, s_p2p_seq); /* (send's, recv's): peer -> next seq */
        if (pair == NULL) goto unprobed;
        int ok = -1;
        PyObject *seqs = PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 ? PyTuple_GET_ITEM(pair, self->seq_dir)
                                                                                 : NULL;
        if (seqs != NULL && PyDict_CheckExact(seqs)) {
            seq = PyDict_GetItemWithError(seqs, peer);
            if (seq != NULL || !PyErr_Occurred()) {
                seq = seq != NULL ? seq : i_0;
                Py_INCREF(seq);
                PyObject *s1 = PyNumber_Add(seq, i_1);
                if (s1 != NULL) {
                    ok = PyDict_SetItem(seqs, peer, s1);
                    Py_DECREF(s1);
                }
            }
        } else {
            PyErr_SetString(PyExc_TypeError, "p2p_seq is not a pair of dicts");
        }
        Py_DECREF(pair);
        if (ok < 0) goto unprobed;
    } else {
        seq = slot_get(g, self->off_seq, s_seq);
        if (seq == NULL) goto unprobed;
        PyObject *s1 = PyNumber_Add(seq, i_1);
        if (s1 == NULL) goto unprobed;
        Py_XSETREF(SLOT(g, self->off_seq), s1); /* g.seq = seq + 1 */
    }
    op_id = PyIter_Next(self->ids);
    if (op_id == NULL) {
        if (!PyErr_Occurred()) PyErr_SetNone(PyExc_StopIteration);
        goto unprobed;
    }
    t0 = mono_ns();
    if (t0 == NULL) goto unprobed;
    PyObject *gid = slot_get(g, self->off_gid, s_gid);
    if (gid == NULL) goto unprobed;
    /* a list with room for its end's time (no resize to fold it in) */
    start = PyList_New(START_LEN + 1);
    if (start == NULL) {
        Py_DECREF(gid);
        goto unprobed;
    }
    Py_SET_SIZE(start, START_LEN);
    /* deferred: [START, op_id, t, name, gid, seq, x, "", (), peer, -1, is_async, red], the tensor's fields
       read by the drain; for the ring, read now: [START, op_id, t, name, gid, seq, nbytes, dtype, shape, ...] */
    PyObject *items[START_LEN] = {self->start_c, op_id, t0, self->name, gid, seq, x, s_empty, s_empty_tuple, peer,
                           i_minus1, is_async ? Py_True : Py_False, self->red_default_name};
    if (ring != NULL) {
        items[6] = nbytes;
        items[7] = dtname;
        items[8] = shape;
    }
    for (int i = 0; i < START_LEN; i++) {
        if (i != 4) Py_INCREF(items[i]); /* gid: its reference moves in */
        PyList_SET_ITEM(start, i, items[i]);
    }
    /* No record is part of a cycle (it holds plain values and the caller's tensor), and
       thousands of them wait a flush interval in the queue: left tracked, every young
       collection would walk them and promote them on towards the costly old ones. */
    PyObject_GC_UnTrack(start);
    int queued = push(self, start);
    if (queued < 0) goto unprobed;
    /* the start is the queue's last record while no drain has run and its length is this */
    unsigned long long drains0 = drains;
    Py_ssize_t queued_len = queued > 0 && self->len_c != NULL ? self->len_c(self->queue) : -1;
    if (ring != NULL) {
        PyObject *ring_args[2] = {op_id, start};
        PyObject *r = PyObject_Vectorcall(ring, ring_args, 2, NULL);
        if (r == NULL) { /* as Python: an Exception is the probe's (health.internal), the op goes on */
            if (!PyErr_ExceptionMatches(PyExc_Exception)) goto raise; /* Ctrl-C: up, the op not run */
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            PyErr_NormalizeException(&et, &ev, &tb);
            r = PyObject_CallMethod(self->health, "internal", "sO", "ring", ev != NULL ? ev : Py_None);
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
            if (r == NULL) goto unprobed;
        }
        Py_DECREF(r);
    }

    self->fast_calls++;
    set_depth(st, i_1); /* st[DEPTH] = 1 */
    result = PyObject_Vectorcall(self->orig, args, nargsf, NULL);
    set_depth(st, i_0); /* st[DEPTH] = 0 */
    if (result == NULL) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        if (tb != NULL && ev != NULL) PyException_SetTraceback(ev, tb);
        PyObject *r = PyObject_CallFunctionObjArgs(self->failed, self->probe, self->name, op_id,
                                                   ev != NULL ? ev : Py_None, NULL);
        if (r == NULL) { /* _failed raised (a BaseException): that one goes up, the user's as its context */
            PyObject *nt, *nv, *ntb;
            PyErr_Fetch(&nt, &nv, &ntb);
            PyErr_NormalizeException(&nt, &nv, &ntb);
            if (nv != NULL && ev != NULL && nv != ev) {
                Py_INCREF(ev);
                PyException_SetContext(nv, ev);
            }
            PyErr_Restore(nt, nv, ntb);
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
        } else {
            Py_DECREF(r);
            PyErr_Restore(et, ev, tb);
        }
        goto done;
    }
    if (result == Py_None && PyList_GET_SIZE(st) > COALESCED && PyList_GET_ITEM(st, COALESCED) == Py_None) {
        PyObject *t1 = mono_ns(), *end = NULL;
        /* Folded: a start still the queue's last record (no drain has taken it, no
           other thread queued after it, so the end's place in the stream is the
           same) gets its end's time as one more item, and the frame's encoder writes
           both events from it (commviz/_fastpack.c): no end record is made, queued,
           popped and freed. */
        int did_fold = 0;
        if (t1 != NULL && self->fold && queued_len >= 0 && drains == drains0 && self->len_c(self->queue) == queued_len &&
            PyList_GET_SIZE(start) == START_LEN) {
            did_fold = PyList_Append(start, t1) == 0; /* room was made for it */
            if (did_fold) {
                Py_INCREF(fold_tag);
                Py_SETREF(((PyListObject *)start)->ob_item[0], fold_tag); /* START is held elsewhere: no code runs */
            } else {
                PyErr_Clear();
            }
        }
        if (!did_fold && t1 != NULL && (end = PyTuple_Pack(6, self->end_c, op_id, t1, s_empty, i_minus1, i_minus1)) != NULL)
            PyObject_GC_UnTrack(end); /* plain values only */
        if (!did_fold && (end == NULL || push(self, end) < 0)) {
            Py_CLEAR(result);
        } else if (ring != NULL) { /* probe.ring_end(op_id, t1): never raises (trace/ring.py) */
            /* read again: the call ran Python (torch's), which may have changed it */
            if (!fresh(self->probe_dict, self->probe_ver, self->probe_read) && read_probe(self) < 0) PyErr_Clear();
            PyObject *ring_end = self->probe_read ? self->v_ring_end : NULL;
            Py_XINCREF(ring_end);
            PyObject *end_args[2] = {op_id, t1};
            PyObject *r = ring_end == NULL ? NULL : PyObject_Vectorcall(ring_end, end_args, 2, NULL);
            Py_XDECREF(ring_end);
            if (r == NULL) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "probe.ring_end");
                Py_CLEAR(result);
            } else {
                Py_DECREF(r);
            }
        }
        Py_XDECREF(t1);
        Py_XDECREF(end);
        goto done;
    }
    {
        PyObject *r = PyObject_CallFunctionObjArgs(self->complete, op_id, t0, peer, g, result, NULL);
        if (r == NULL)
            Py_CLEAR(result);
        else
            Py_DECREF(r);
    }
done:
    Py_DECREF(st);
    Py_DECREF(g);
    Py_DECREF(peer);
    Py_XDECREF(seq);
    Py_XDECREF(op_id);
    Py_XDECREF(t0);
    Py_XDECREF(start);
    Py_XDECREF(ring);
    Py_XDECREF(nbytes);
    Py_XDECREF(dtname);
    Py_XDECREF(shape);
    return result;

raise: /* a BaseException that is not an Exception (KeyboardInterrupt, SystemExit): up, as from Python */
    result = NULL;
    goto done;

unprobed: {
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) goto raise;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (tb != NULL && ev != NULL) PyException_SetTraceback(ev, tb);
    result = NULL;
    PyObject *targs = PyTuple_New(n), *kw = PyDict_New();
    if (targs != NULL && kw != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(targs, i, args[i]);
        }
        self->slow_calls++;
        result = PyObject_CallFunctionObjArgs(self->unprobed, self->orig, targs, kw, self->probe, self->name,
                                              ev != NULL ? ev : Py_None, NULL);
    }
    Py_XDECREF(targs);
    Py_XDECREF(kw);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    goto done;
}

slow_clear:
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
        going_up = 1; /* Ctrl-C in a read: up, as from Python */
    else
        PyErr_Clear();
slow:
    Py_DECREF(st);
    Py_XDECREF(g);
    Py_XDECREF(ring);
    Py_XDECREF(nbytes);
    Py_XDECREF(dtname);
    Py_XDECREF(shape);
    return going_up ? NULL : call_slow(self, args, nargsf, kwnames);
}

static int fw_traverse(FastWrapper *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    Py_VISIT(self->orig);
    Py_VISIT(self->slow);
    Py_VISIT(self->probe);
    Py_VISIT(self->tls);
    Py_VISIT(self->name);
    Py_VISIT(self->queue);
    Py_VISIT(self->append);
    Py_VISIT(self->ids);
    Py_VISIT(self->groups);
    Py_VISIT(self->health);
    Py_VISIT(self->seq_key);
    Py_VISIT(self->red_default);
    Py_VISIT(self->red_default_name);
    Py_VISIT(self->start_c);
    Py_VISIT(self->end_c);
    Py_VISIT(self->cuda);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->failed);
    Py_VISIT(self->complete);
    Py_VISIT(self->unprobed);
    Py_VISIT(self->dtypes);
    Py_VISIT(self->probe_dict);
    Py_VISIT(self->cuda_dict);
    Py_VISIT(self->group_type);
    Py_VISIT(self->st_cached);
    Py_VISIT(self->last_dt);
    Py_VISIT(self->last_dtname);
    return 0;
}

static int fw_clear(FastWrapper *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->orig);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->probe);
    Py_CLEAR(self->tls);
    Py_CLEAR(self->name);
    Py_CLEAR(self->queue);
    Py_CLEAR(self->append);
    Py_CLEAR(self->ids);
    Py_CLEAR(self->groups);
    Py_CLEAR(self->health);
    Py_CLEAR(self->seq_key);
    Py_CLEAR(self->red_default);
    Py_CLEAR(self->red_default_name);
    Py_CLEAR(self->start_c);
    Py_CLEAR(self->end_c);
    Py_CLEAR(self->cuda);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->failed);
    Py_CLEAR(self->complete);
    Py_CLEAR(self->unprobed);
    Py_CLEAR(self->dtypes);
    Py_CLEAR(self->probe_dict);
    Py_CLEAR(self->cuda_dict);
    Py_CLEAR(self->group_type);
    Py_CLEAR(self->st_cached);
    Py_CLEAR(self->last_dt);
    Py_CLEAR(self->last_dtname);
    self->probe_read = self->cuda_read = 0; /* what they read was borrowed from the dicts cleared above */
    return 0;
}

static void fw_dealloc(FastWrapper *self) {
    PyObject_GC_UnTrack(self);
    fw_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *fw_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"orig", "slow", "probe", "tls", "name", "queue", "cap", "ids", "groups", "health",
                             "p2p", "always_async", "seq_key", "bi", "gi", "ai", "ri", "pi", "red_default",
                             "red_default_name", "START", "END", "cuda", "Tensor", "failed", "complete",
                             "unprobed", "GroupInfo", "dtypes", "fold", NULL};
    PyObject *orig, *slow, *probe, *tls, *name, *queue, *ids, *groups, *health, *seq_key, *red_default,
        *red_default_name, *start_c, *end_c, *cuda, *tensor_type, *failed, *complete, *unprobed, *group_type,
        *dtypes;
    Py_ssize_t cap, bi, gi, ai, ri, pi;
    int p2p, always_async;
    PyObject *fold = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOUOnOO!OppOnnnnnOUOOOO!OOOO!O!|O:FastWrapper", kwlist, &orig, &slow,
                                     &probe, &tls, &name, &queue, &cap, &ids, &PyDict_Type, &groups, &health, &p2p,
                                     &always_async, &seq_key, &bi, &gi, &ai, &ri, &pi, &red_default,
                                     &red_default_name, &start_c, &end_c, &cuda, &PyType_Type, &tensor_type, &failed,
                                     &complete, &unprobed, &PyType_Type, &group_type, &PyDict_Type, &dtypes, &fold))
        return NULL;
    /* The attributes read from dicts must be plain ones: no descriptor of that name
       on the type (a property would be skipped), and the dicts exist. */
    PyObject *names[] = {s_started, s_ring_start, s_ring_end, s_default_group};
    for (int i = 0; i < 4; i++)
        if (_PyType_Lookup(Py_TYPE(probe), names[i]) != NULL)
            return PyErr_Format(PyExc_TypeError, "probe.%U is not a plain attribute", names[i]);
    if (!PyModule_Check(cuda) || _PyType_Lookup(Py_TYPE(cuda), s_initialized) != NULL)
        return PyErr_Format(PyExc_TypeError, "cuda is not a module");
    PyObject *slot_names[] = {s_pg, s_seq, s_gid, s_p2p_seq};
    Py_ssize_t offs[4];
    for (int i = 0; i < 4; i++) {
        PyObject *d = _PyType_Lookup((PyTypeObject *)group_type, slot_names[i]);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX ||
            ((PyMemberDescrObject *)d)->d_member->flags & READONLY ||
            ((PyMemberDescrObject *)d)->d_common.d_type != (PyTypeObject *)group_type)
            return PyErr_Format(PyExc_TypeError, "GroupInfo.%U is not a slot", slot_names[i]);
        offs[i] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    int seq_dir = PyLong_CheckExact(seq_key) ? (int)PyLong_AsLong(seq_key) : -1;
    if (seq_dir != 0 && seq_dir != 1) {
        PyErr_Clear();
        return PyErr_Format(PyExc_ValueError, "seq_key is 0 (send) or 1 (recv)");
    }
    if (((PyTypeObject *)group_type)->tp_setattro != PyObject_GenericSetAttr)
        return PyErr_Format(PyExc_TypeError, "GroupInfo sets attributes its own way");
    PyObject *probe_dict = PyObject_GenericGetDict(probe, NULL);
    if (probe_dict == NULL) return NULL;
    PyObject *cuda_dict = PyModule_GetDict(cuda); /* borrowed */
    PyObject *append = PyObject_GetAttrString(queue, "append");
    if (append == NULL) {
        Py_DECREF(probe_dict);
        return NULL;
    }
    FastWrapper *self = (FastWrapper *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(append);
        Py_DECREF(probe_dict);
        return NULL;
    }
    self->probe_dict = probe_dict;
    Py_INCREF(cuda_dict);
    self->cuda_dict = cuda_dict;
    Py_INCREF(group_type);
    self->group_type = group_type;
    self->off_pg = offs[0];
    self->off_seq = offs[1];
    self->off_gid = offs[2];
    self->off_p2p_seq = offs[3];
    self->vectorcall = fw_vectorcall;
#define SET(f, v)     \
    Py_INCREF(v);     \
    self->f = v;
    SET(orig, orig) SET(slow, slow) SET(probe, probe) SET(tls, tls) SET(name, name) SET(queue, queue);
    SET(ids, ids) SET(groups, groups) SET(health, health) SET(seq_key, seq_key) SET(red_default, red_default);
    SET(red_default_name, red_default_name) SET(start_c, start_c) SET(end_c, end_c) SET(cuda, cuda);
    SET(tensor_type, tensor_type) SET(failed, failed) SET(complete, complete) SET(unprobed, unprobed);
    SET(dtypes, dtypes);
#undef SET
    self->append = append;
    /* a deque (its append is a C function taking one argument, bound to it): both
       called as what they are, not through the generic call and size protocols */
    if (PyCFunction_Check(append) && (PyCFunction_GET_FLAGS(append) & (METH_O | METH_METHOD)) == METH_O &&
        PyCFunction_GET_SELF(append) == queue && Py_TYPE(queue)->tp_as_sequence != NULL &&
        Py_TYPE(queue)->tp_as_sequence->sq_length != NULL) {
        self->append_c = PyCFunction_GET_FUNCTION(append);
        self->len_c = Py_TYPE(queue)->tp_as_sequence->sq_length;
    }
    /* torch's getters, where Tensor gets attributes as any type does and each field
       is a getset descriptor found on it (Python would call the same one); its
       version tag taken first, so a type that changes during the lookup is not
       trusted (tensor_field) */
    PyTypeObject *tt = (PyTypeObject *)tensor_type;
    if (tt->tp_getattro == PyObject_GenericGetAttr && PyType_HasFeature(tt, Py_TPFLAGS_VALID_VERSION_TAG)) {
        unsigned int version = tt->tp_version_tag;
        PyObject *fields[3] = {s_nbytes, s_dtype, s_shape};
        PyGetSetDef *found[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; i++) {
            PyObject *d = _PyType_Lookup(tt, fields[i]);
            if (d != NULL && Py_IS_TYPE(d, &PyGetSetDescr_Type) && ((PyGetSetDescrObject *)d)->d_getset->get != NULL &&
                PyType_IsSubtype(tt, ((PyDescrObject *)d)->d_type))
                found[i] = ((PyGetSetDescrObject *)d)->d_getset;
        }
        if (found[0] != NULL && found[1] != NULL && found[2] != NULL && tt->tp_version_tag == version) {
            self->get_nbytes = found[0];
            self->get_dtype = found[1];
            self->get_shape = found[2];
            self->tensor_version = version;
        }
    }
    self->cap = cap;
    self->bi = bi;
    self->gi = gi;
    self->ai = ai;
    self->ri = ri;
    self->pi = pi;
    self->p2p = p2p;
    self->always_async = always_async;
    self->seq_dir = seq_dir;
    if (fold != Py_None) { /* one tag for the process: the drain knows it */
        if (fold_tag == NULL) {
            Py_INCREF(fold);
            fold_tag = fold;
        }
        self->fold = fold == fold_tag;
    }
    return (PyObject *)self;
}

static PyObject *fw_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *fw_repr(FastWrapper *self) {
    return PyUnicode_FromFormat("<commviz fast wrapper of %U>", self->name);
}

/* pickled (and copied) by name, as a function is: torch.distributed.all_reduce is this object */
static PyObject *fw_reduce(PyObject *self, PyObject *unused) {
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef fw_methods[] = {
    {"__reduce__", fw_reduce, METH_NOARGS, NULL},
    {NULL},
};

static PyMemberDef fw_members[] = {
    {"_commviz_slow", T_OBJECT, offsetof(FastWrapper, slow), READONLY, "the Python wrapper, for the other calls"},
    {"fast_calls", T_ULONGLONG, offsetof(FastWrapper, fast_calls), READONLY, "calls taken in C"},
    {"slow_calls", T_ULONGLONG, offsetof(FastWrapper, slow_calls), READONLY, "calls handed to Python"},
    {"nested_calls", T_ULONGLONG, offsetof(FastWrapper, nested_calls), READONLY, "nested calls passed to torch"},
    {NULL},
};

static PyGetSetDef fw_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL},
};

static PyTypeObject FastWrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commviz.probe._fastwrap.FastWrapper",
    .tp_basicsize = sizeof(FastWrapper),
    .tp_dealloc = (destructor)fw_dealloc,
    .tp_vectorcall_offset = offsetof(FastWrapper, vectorcall),
    .tp_repr = (reprfunc)fw_repr,
    .tp_call = PyVectorcall_Call,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = NULL,
    .tp_traverse = (traverseproc)fw_traverse,
    .tp_clear = (inquiry)fw_clear,
    .tp_methods = fw_methods,
    .tp_members = fw_members,
    .tp_getset = fw_getset,
    .tp_descr_get = fw_descr_get,
    .tp_dictoffset = offsetof(FastWrapper, dict),
    .tp_new = fw_new,
};

/* 1 if recs[i + 1] exists and is the end of the op whose id is op_id, 0 if not, -1 on error */
static int ends_next(PyObject *recs, Py_ssize_t i, PyObject *op_id, PyObject *start_c, PyObject *end_c,
                     Py_ssize_t e_id) {
    if (i + 1 >= PyList_GET_SIZE(recs)) return 0;
    PyObject *next = PyList_GET_ITEM(recs, i + 1);
    if (!PyTuple_CheckExact(next) || PyTuple_GET_SIZE(next) <= e_id) return 0;
    PyObject *tag = PyTuple_GET_ITEM(next, 0);
    if (tag != end_c) {
        int is_start = PyObject_RichCompareBool(tag, start_c, Py_EQ); /* what is not a start is an end */
        if (is_start != 0) return is_start < 0 ? -1 : 0;
    }
    PyObject *id = PyTuple_GET_ITEM(next, e_id);
    return id == op_id ? 1 : PyObject_RichCompareBool(id, op_id, Py_EQ);
}

/* inflight.pop(op_id, None), without a lookup while nothing is in flight; 0 or -1 */
static int forget(PyObject *inflight, PyObject *op_id) {
    if (PyDict_GET_SIZE(inflight) == 0 || PyDict_DelItem(inflight, op_id) == 0) return 0;
    if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
    PyErr_Clear();
    return 0;
}

/* a start in flight, unless the next record is its own end (a blocking op): then
   neither is kept; 1 when that end was taken with it, 0 when not, -1 on error */
static int take_start(PyObject *recs, Py_ssize_t i, PyObject *rec, PyObject *op_id, PyObject *inflight,
                      PyObject *start_c, PyObject *end_c, Py_ssize_t e_id) {
    int ended = ends_next(recs, i, op_id, start_c, end_c, e_id);
    if (ended < 0) return -1;
    if (ended) return forget(inflight, op_id) < 0 ? -1 : 1;
    return PyDict_SetItem(inflight, op_id, rec) < 0 ? -1 : 0;
}

/* drain(records, inflight, fields, START, END, (S_ID, S_BYTES, S_DTYPE, S_SHAPE, E_ID)):
 * the sender's loop over what it popped (probe/sender.py, _drain, which does the same
 * in Python where this is not built), a few dozen instructions a record instead of
 * a few hundred: a deferred start (a list, its tensor in the bytes field) gets the
 * tensor's bytes, dtype and shape from fields(x) -> (x, nbytes, dtype, shape), once
 * per tensor per batch (the cache holds each tensor while it runs, so an address
 * stands for one tensor), and goes in flight; a start tuple, or a list whose bytes
 * are an int (read when it was made, for the crash ring), goes in flight; any other
 * tuple is an end and leaves it. A start followed by its own end (a blocking op)
 * is not put in flight to be taken out again, nor is a folded op (FOLDED first, the
 * end's time last). Every other record is returned, in order, for Python to look
 * at. (The C wrapper alone makes folded ops and lists with the bytes read: where
 * this is not built, neither is it.) */
static PyObject *fast_drain(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    drained(); /* from here no start popped for this drain gets its end folded in */
    Py_ssize_t ix[5];
    if (nargs != 6 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1]) || !PyTuple_CheckExact(args[5]) ||
        PyTuple_GET_SIZE(args[5]) != 5)
        return PyErr_Format(PyExc_TypeError,
                            "drain(records, inflight, fields, START, END, (S_ID, S_BYTES, S_DTYPE, S_SHAPE, E_ID))");
    for (int i = 0; i < 5; i++)
        if ((ix[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[5], i))) < 0)
            return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "a negative index");
    Py_ssize_t need = 0;
    for (int i = 0; i < 4; i++) need = ix[i] >= need ? ix[i] + 1 : need;
    PyObject *recs = args[0], *inflight = args[1], *fields = args[2], *start_c = args[3], *end_c = args[4];
    PyObject *others = PyList_New(0), *tensors = PyDict_New();
    PyObject *last_x = NULL, *last_hit = NULL; /* borrowed from tensors: the tensor read last */
    if (others == NULL || tensors == NULL) goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(recs); i++) {
        PyObject *rec = PyList_GET_ITEM(recs, i);
        if (PyList_CheckExact(rec) && PyList_GET_SIZE(rec) >= need && PyLong_CheckExact(PyList_GET_ITEM(rec, ix[1]))) {
            /* a start whose tensor was read when it was made (the crash ring's) */
            int took = folded(rec) ? 0 : take_start(recs, i, rec, PyList_GET_ITEM(rec, ix[0]), inflight, start_c, end_c,
                                                    ix[4]);
            if (took < 0) goto fail;
            i += took;
        } else if (PyList_CheckExact(rec) && PyList_GET_SIZE(rec) >= need) {
            Py_INCREF(rec); /* fields() runs Python, which could empty the list we walk */
            PyObject *x = PyList_GET_ITEM(rec, ix[1]);
            Py_INCREF(x);
            PyObject *key = NULL, *hit = NULL;
            if (x == last_x) {
                hit = last_hit;
                Py_INCREF(hit);
            } else if ((key = PyLong_FromVoidPtr(x)) != NULL && (hit = PyDict_GetItemWithError(tensors, key)) != NULL) {
                Py_INCREF(hit);
            } else if (key != NULL && !PyErr_Occurred()) {
                hit = PyObject_CallOneArg(fields, x);
                if (hit != NULL && (!PyTuple_CheckExact(hit) || PyTuple_GET_SIZE(hit) != 4)) {
                    Py_CLEAR(hit);
                    PyErr_SetString(PyExc_TypeError, "fields(x) must return (x, nbytes, dtype, shape)");
                }
                if (hit != NULL && PyDict_SetItem(tensors, key, hit) < 0) Py_CLEAR(hit);
            }
            Py_XDECREF(key);
            Py_DECREF(x);
            if (hit != NULL) { /* held by tensors, as is its tensor, for the batch */
                last_x = PyTuple_GET_ITEM(hit, 0);
                last_hit = hit;
            }
            int ok = hit != NULL && PyList_GET_SIZE(rec) >= need;
            if (hit != NULL && !ok) PyErr_SetString(PyExc_RuntimeError, "a queued start changed while it was read");
            for (int f = 1; ok && f < 4; f++) {
                PyObject *v = PyTuple_GET_ITEM(hit, f);
                Py_INCREF(v);
                ok = PyList_SetItem(rec, ix[f], v) == 0;
            }
            int took = !ok ? -1
                       : folded(rec) ? 0 /* its end is in it: nothing in flight */
                       : take_start(recs, i, rec, PyList_GET_ITEM(rec, ix[0]), inflight, start_c, end_c, ix[4]);
            if (took > 0) i++;
            Py_XDECREF(hit);
            Py_DECREF(rec);
            if (took < 0) goto fail;
        } else if (PyTuple_CheckExact(rec) && PyTuple_GET_SIZE(rec) > ix[0] && PyTuple_GET_SIZE(rec) > ix[4]) {
            PyObject *tag = PyTuple_GET_ITEM(rec, 0);
            int is_start = tag == start_c ? 1 : tag == end_c ? 0 : PyObject_RichCompareBool(tag, start_c, Py_EQ);
            if (is_start < 0) goto fail;
            int took = is_start ? take_start(recs, i, rec, PyTuple_GET_ITEM(rec, ix[0]), inflight, start_c, end_c, ix[4])
                                : forget(inflight, PyTuple_GET_ITEM(rec, ix[4]));
            if (took < 0) goto fail;
            i += took;
        } else if (PyList_Append(others, rec) < 0) {
            goto fail;
        }
    }
    Py_DECREF(tensors);
    return others;
fail:
    Py_XDECREF(others);
    Py_XDECREF(tensors);
    return NULL;
}

static PyObject *deque_type; /* collections.deque: take() takes nothing else */

/* take(queue) -> list: everything queued, in order, and the queue emptied, in one
 * step no other thread can get between (no Python runs: it takes only an exact
 * collections.deque, and clearing it frees nothing, the list holding every record).
 * A popleft per record from Python's side costs ~8 ns each, this ~1. */
static PyObject *take(PyObject *mod, PyObject *queue) {
    if (deque_type == NULL || !Py_IS_TYPE(queue, (PyTypeObject *)deque_type))
        return PyErr_Format(PyExc_TypeError, "take() takes a collections.deque");
    drained(); /* what it takes is the drain's: no end is folded into it from here */
    PyObject *out = PySequence_List(queue);
    if (out == NULL) return NULL;
    PyObject *r = PyObject_CallMethodNoArgs(queue, s_clear);
    if (r == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    Py_DECREF(r);
    return out;
}

static PyMethodDef module_methods[] = {
    {"drain", (PyCFunction)(void (*)(void))fast_drain, METH_FASTCALL, "the sender's loop over popped records"},
    {"take", (PyCFunction)take, METH_O, "take(queue): its records, in order, and the queue emptied at once"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastwrap", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__fastwrap(void) {
#define INTERN(v, s) \
    if ((v = PyUnicode_InternFromString(s)) == NULL) return NULL;
    INTERN(s_s, "s") INTERN(s_started, "started") INTERN(s_ring_start, "ring_start");
    INTERN(s_initialized, "_initialized") INTERN(s_default_group, "default_group") INTERN(s_pg, "pg");
    INTERN(s_seq, "seq") INTERN(s_p2p_seq, "p2p_seq") INTERN(s_gid, "gid") INTERN(s_dropped, "dropped");
    INTERN(s_empty, "") INTERN(s_ring_end, "ring_end") INTERN(s_nbytes, "nbytes") INTERN(s_dtype, "dtype");
    INTERN(s_shape, "shape") INTERN(s_clear, "clear");
#undef INTERN
    if ((s_empty_tuple = PyTuple_New(0)) == NULL) return NULL;
    if ((i_minus1 = PyLong_FromLong(-1)) == NULL) return NULL;
    if ((i_0 = PyLong_FromLong(0)) == NULL) return NULL;
    if ((i_1 = PyLong_FromLong(1)) == NULL) return NULL;
    if (PyType_Ready(&FastWrapperType) < 0) return NULL;
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL) return NULL;
    deque_type = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (deque_type == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&FastWrapperType);
    if (PyModule_AddObject(m, "FastWrapper", (PyObject *)&FastWrapperType) < 0) {
        Py_DECREF(&FastWrapperType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
