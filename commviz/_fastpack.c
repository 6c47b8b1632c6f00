/* msgpack written in C, where Python per value is the cost: the crash ring's slots
 * (trace/ring.py), written on the caller's thread on every op, and the wire's frames
 * (events.py, encode_batch), encoded on the probe's thread for every op. Both write
 * exactly the bytes msgspec writes (the smallest form of each int, string and array
 * length; tests/test_events.py and tests/trace/test_ring_writers.py compare them), so a
 * reader cannot tell which wrote them. They pack the probe's records — tuples and
 * lists of None, bools, ints, strings and shapes — and hand anything else to
 * msgspec: a record with a float or an int past 64 bits whole, an event Struct as
 * itself. Packing runs no Python code.
 *
 * The ring's slot writers. The layout is ring.py's: it hands over the header size,
 * the slot count and size and the index of the shape in a start, and binds these
 * writers only where its slot head's struct format is SLOT_HEAD below (and its
 * end's END_HEAD), so the layout is still defined once and a change there falls
 * back to Python rather than writing the old one here. Nothing can close the
 * mapping while a slot is written (no Python runs); the buffer is held from
 * construction to release(), which ring.py calls before closing the mapping, and
 * after which both writers do nothing (as Python's do on a closed mapping).
 *
 * The frame encoder: a Batch (events.py) is [schema, rank, [event, ...]], msgspec's
 * array_like encoding; events.py checks at import that this writes what msgspec
 * writes for a sample frame, and uses msgspec where it does not.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <longintrepr.h> /* digits: Python.h has them from 3.11 on */
#endif
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define SLOT_HEAD_FORMAT "<qBxHxxxxq" /* end_t, state, payload length, op id */
#define END_HEAD_FORMAT "<qB"         /* end_t, state */
#define HEAD 24

typedef struct {
    PyObject_HEAD
    Py_buffer buf;
    int held;
    Py_ssize_t base, mask, slot_size, shape_at;
    PyObject *py_start; /* the Python writer, for a start this packer does not take */
    unsigned long long packed, handed;
} SlotWriter;

/* ---- msgpack, as msgspec writes it */

typedef struct {
    uint8_t *p, *end;
    uint8_t *start;  /* a growable buffer's, else NULL: a fixed one is FULL when full */
    PyObject *bytes; /* the growable buffer: a bytes object, resized as it fills and to its length at the end */
} Out;

enum { OK = 0, FULL = -1, FOREIGN = -2, NOMEM = -3 };

#define INLINE static inline __attribute__((always_inline))

static int grow(Out *o, size_t n) {
    size_t used = o->p - o->start, cap = o->end - o->start, want = cap * 2 > used + n ? cap * 2 : used + n + 4096;
    if (_PyBytes_Resize(&o->bytes, (Py_ssize_t)want) < 0) return NOMEM; /* it is freed, and NULL */
    uint8_t *b = (uint8_t *)PyBytes_AS_STRING(o->bytes);
    o->start = b;
    o->p = b + used;
    o->end = b + want;
    return OK;
}

/* Room for n more bytes and SLACK after them: the values a record writes between
   two checks (its ints and bools, at most 9 bytes each, and the fixed heads of a
   folded op) fit in the slack, so they are written unchecked (pack_folded). */
#define SLACK 256

INLINE int reserve(Out *o, size_t n) {
    n += SLACK;
    if (__builtin_expect((size_t)(o->end - o->p) >= n, 1)) return OK;
    if (o->start == NULL) return FULL;
    return grow(o, n);
}

INLINE void w_be(uint8_t *p, uint64_t v, int width) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    switch (width) { /* one byte swap and store, not a loop of shifts */
    case 8: {
        uint64_t b = __builtin_bswap64(v);
        memcpy(p, &b, 8);
        return;
    }
    case 4: {
        uint32_t b = __builtin_bswap32((uint32_t)v);
        memcpy(p, &b, 4);
        return;
    }
    case 2: {
        uint16_t b = __builtin_bswap16((uint16_t)v);
        memcpy(p, &b, 2);
        return;
    }
    }
#endif
    for (int i = 0; i < width; i++) p[i] = (uint8_t)(v >> (8 * (width - 1 - i)));
}

/* tag, then v big-endian in width bytes; room was reserved */
INLINE void w_tagged(Out *o, uint8_t tag, uint64_t v, int width) {
    o->p[0] = tag;
    w_be(o->p + 1, v, width);
    o->p += 1 + width;
}

/* msgspec's form of x: the smallest that holds it; 9 bytes were reserved */
INLINE void w_ll(Out *o, long long x) {
    if (x >= 0) {
        if (x < 128)
            *o->p++ = (uint8_t)x;
        else if (x < 256)
            w_tagged(o, 0xcc, (uint64_t)x, 1);
        else if (x < 65536)
            w_tagged(o, 0xcd, (uint64_t)x, 2);
        else if (x < 4294967296LL)
            w_tagged(o, 0xce, (uint64_t)x, 4);
        else
            w_tagged(o, 0xcf, (uint64_t)x, 8);
    } else if (x >= -32) {
        *o->p++ = (uint8_t)(int8_t)x;
    } else if (x >= -128) {
        w_tagged(o, 0xd0, (uint64_t)x, 1);
    } else if (x >= -32768) {
        w_tagged(o, 0xd1, (uint64_t)x, 2);
    } else if (x >= -2147483648LL) {
        w_tagged(o, 0xd2, (uint64_t)x, 4);
    } else {
        w_tagged(o, 0xd3, (uint64_t)x, 8);
    }
}

/* 1 and *x = v for an exact int of at most two digits, read as CPython keeps it
   before 3.12 (PyLong_AsLongLong is ~120 instructions for a clock reading, ~10 here);
   0 where it cannot say so */
INLINE int small_int(PyObject *v, long long *x) {
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    Py_ssize_t size = Py_SIZE(v);
    const digit *d = ((PyLongObject *)v)->ob_digit;
    switch (size) {
    case 0: *x = 0; return 1;
    case 1: *x = (long long)d[0]; return 1;
    case -1: *x = -(long long)d[0]; return 1;
    case 2: *x = (long long)d[0] | ((long long)d[1] << 30); return 1;
    case -2: *x = -((long long)d[0] | ((long long)d[1] << 30)); return 1;
    }
#endif
    return 0;
}

/* v as a long long, -1 with an exception set where it is not an int that fits */
static long long as_ll(PyObject *v) {
    long long x;
    if (PyLong_CheckExact(v) && small_int(v, &x)) return x;
    return PyLong_AsLongLong(v);
}

/* an exact int past two digits; 9 bytes were reserved */
static int w_big_int(Out *o, PyObject *v) {
    long long x;
    int overflow;
    x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow > 0) { /* msgspec takes up to 2**64 - 1 */
        unsigned long long u = PyLong_AsUnsignedLongLong(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return FOREIGN;
        }
        w_tagged(o, 0xcf, u, 8);
        return OK;
    }
    if (overflow < 0) return FOREIGN;
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return FOREIGN;
    }
    w_ll(o, x);
    return OK;
}

/* an exact int; 9 bytes were reserved */
INLINE int w_int(Out *o, PyObject *v) {
    long long x;
    if (!small_int(v, &x)) return w_big_int(o, v);
    w_ll(o, x);
    return OK;
}

/* n bytes from s to p: the probe's strings (names, tags, dtypes) are short, and a
   call to memcpy costs more than they do; two loads that may overlap cover 4 to 16
   bytes, and neither reads outside s[0..n) */
INLINE void copy_short(uint8_t *p, const char *s, Py_ssize_t n) {
    if (n >= 8 && n <= 16) {
        uint64_t a, b;
        memcpy(&a, s, 8);
        memcpy(&b, s + n - 8, 8);
        memcpy(p, &a, 8);
        memcpy(p + n - 8, &b, 8);
    } else if (n >= 4 && n < 8) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + n - 4, 4);
        memcpy(p, &a, 4);
        memcpy(p + n - 4, &b, 4);
    } else if (n < 4) {
        for (Py_ssize_t i = 0; i < n; i++) p[i] = (uint8_t)s[i];
    } else {
        memcpy(p, s, (size_t)n);
    }
}

INLINE int pack_str(Out *o, PyObject *v) {
    Py_ssize_t n;
    const char *s;
    if (PyUnicode_IS_COMPACT_ASCII(v)) { /* its bytes are its UTF-8 */
        s = (const char *)PyUnicode_DATA(v);
        n = PyUnicode_GET_LENGTH(v);
    } else if ((s = PyUnicode_AsUTF8AndSize(v, &n)) == NULL) { /* a lone surrogate: msgspec's to say */
        PyErr_Clear();
        return FOREIGN;
    }
    int r = reserve(o, 5 + (size_t)n);
    if (r != OK) return r;
    if (n < 32)
        *o->p++ = (uint8_t)(0xa0 | n);
    else if (n < 256)
        w_tagged(o, 0xd9, (uint64_t)n, 1);
    else if (n < 65536)
        w_tagged(o, 0xda, (uint64_t)n, 2);
    else
        w_tagged(o, 0xdb, (uint64_t)n, 4);
    copy_short(o->p, s, n);
    o->p += n;
    return OK;
}

INLINE int pack_len(Out *o, Py_ssize_t n) {
    int r = reserve(o, 5);
    if (r != OK) return r;
    if (n < 16)
        *o->p++ = (uint8_t)(0x90 | n);
    else if (n < 65536)
        w_tagged(o, 0xdc, (uint64_t)n, 2);
    else
        w_tagged(o, 0xdd, (uint64_t)n, 4);
    return OK;
}

static int pack_items(Out *o, PyObject *const *items, Py_ssize_t n, int depth, Py_ssize_t empty_at);

INLINE int pack_value(Out *o, PyObject *v, int depth) {
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyUnicode_Type) return pack_str(o, v);
    int r = reserve(o, 9);
    if (r != OK) return r;
    if (t == &PyLong_Type) return w_int(o, v);
    if (v == Py_False || v == Py_True || v == Py_None) {
        *o->p++ = v == Py_False ? 0xc2 : v == Py_True ? 0xc3 : 0xc0;
        return OK;
    }
    if (depth > 2) return FOREIGN;
    /* a shape: a tuple, torch.Size (a tuple subclass that adds no items) or a list */
    if (PyTuple_Check(v)) return pack_items(o, &PyTuple_GET_ITEM(v, 0), PyTuple_GET_SIZE(v), depth + 1, -1);
    if (PyList_CheckExact(v)) return pack_items(o, PySequence_Fast_ITEMS(v), PyList_GET_SIZE(v), depth + 1, -1);
    return FOREIGN;
}

static int pack_items(Out *o, PyObject *const *items, Py_ssize_t n, int depth, Py_ssize_t empty_at) {
    int r = pack_len(o, n);
    for (Py_ssize_t i = 0; i < n && r == OK; i++) r = i == empty_at ? pack_len(o, 0) : pack_value(o, items[i], depth);
    return r;
}

/* ---- the slot */

static void put_le(uint8_t *p, uint64_t v, int width) {
    for (int i = 0; i < width; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void write_head(uint8_t *slot, long long end_t, int state, Py_ssize_t n, long long op_id) {
    uint8_t h[HEAD] = {0};
    put_le(h, (uint64_t)end_t, 8);
    h[8] = (uint8_t)state;
    put_le(h + 10, (uint64_t)n, 2);
    put_le(h + 16, (uint64_t)op_id, 8);
    memcpy(slot, h, HEAD);
}

static uint8_t *slot_of(SlotWriter *self, long long id) {
    return (uint8_t *)self->buf.buf + self->base + (id & self->mask) * self->slot_size;
}

static PyObject *sw_start(SlotWriter *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "start(op_id, record) takes 2 arguments");
    /* Every argument is read before the ring is looked at: reading an int that is not
       exactly one runs its __index__, which could close the ring. */
    long long id = as_ll(args[0]);
    if (id == -1 && PyErr_Occurred()) return NULL;
    if (!self->held) Py_RETURN_NONE; /* released: the ring is closed */
    PyObject *rec = args[1];
    PyObject *const *items;
    Py_ssize_t n;
    if (PyTuple_CheckExact(rec)) {
        items = &PyTuple_GET_ITEM(rec, 0);
        n = PyTuple_GET_SIZE(rec);
    } else if (PyList_CheckExact(rec)) {
        items = PySequence_Fast_ITEMS(rec);
        n = PyList_GET_SIZE(rec);
    } else {
        goto python;
    }
    uint8_t *slot = slot_of(self, id);
    /* Packed aside, so a start that does not fit or goes to Python leaves the slot's
       payload as it was; then the payload, then the head that points at it (ring.py's
       order): a slot caught half-written carries another op id than its payload and
       is skipped. */
    uint8_t tmp[65536];
    Out o = {tmp, tmp + sizeof tmp, NULL, NULL};
    Py_ssize_t pmax = self->slot_size - HEAD;
    int r = pack_items(&o, items, n, 0, -1);
    if (r == FULL || (r == OK && o.p - tmp > pmax)) { /* a huge shape: keep the rest of the start */
        o.p = tmp;
        r = pack_items(&o, items, n, 0, self->shape_at);
        if (r == OK && o.p - tmp > pmax) r = FULL;
    }
    if (r == FOREIGN || r == NOMEM) goto python;
    if (r == FULL) { /* still too big: no stale op left under this slot (ring.py) */
        write_head(slot, 0, 0, 0, id);
    } else {
        memcpy(slot + HEAD, tmp, o.p - tmp);
        __atomic_signal_fence(__ATOMIC_RELEASE); /* the compiler keeps the payload before the head */
        write_head(slot, 0, 1, o.p - tmp, id);
    }
    self->packed++;
    Py_RETURN_NONE;
python:
    self->handed++;
    return PyObject_Vectorcall(self->py_start, args, 2, NULL);
}

static PyObject *sw_end(SlotWriter *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw < 2 || nargs + nkw > 3 || nargs < 2 ||
        (nkw == 1 && !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0))) ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "failed") != 0))
        return PyErr_Format(PyExc_TypeError, "end(op_id, t, failed=False)");
    nargs += nkw;
    long long id = as_ll(args[0]), t; /* read before the ring is looked at (see start) */
    if (id == -1 && PyErr_Occurred()) return NULL;
    if ((t = as_ll(args[1])) == -1 && PyErr_Occurred()) return NULL;
    int failed = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (failed < 0) return NULL;
    if (!self->held) Py_RETURN_NONE;
    uint8_t *slot = slot_of(self, id);
    uint8_t h[9];
    put_le(h, (uint64_t)t, 8);
    h[8] = failed ? 3 : 2;
    memcpy(slot, h, 9);
    Py_RETURN_NONE;
}

static PyObject *sw_release(SlotWriter *self, PyObject *unused) {
    if (self->held) {
        self->held = 0;
        PyBuffer_Release(&self->buf);
    }
    Py_RETURN_NONE;
}

static PyMethodDef sw_methods[] = {
    {"start", (PyCFunction)(void (*)(void))sw_start, METH_FASTCALL, "start(op_id, record): the op's start in its slot"},
    {"end", (PyCFunction)(void (*)(void))sw_end, METH_FASTCALL | METH_KEYWORDS, "end(op_id, t, failed=False): its end stamped"},
    {"release", (PyCFunction)sw_release, METH_NOARGS, "let the mapping go; the writers do nothing after"},
    {NULL},
};

static PyMemberDef sw_members[] = {
    {"packed", T_ULONGLONG, offsetof(SlotWriter, packed), READONLY, "starts packed here"},
    {"handed", T_ULONGLONG, offsetof(SlotWriter, handed), READONLY, "starts handed to the Python writer"},
    {NULL},
};

static PyObject *sw_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"mapping", "header_size", "slots", "slot_size", "shape_at", "py_start", NULL};
    PyObject *mapping, *py_start;
    Py_ssize_t base, slots, slot_size, shape_at;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnnnnO:SlotWriter", kwlist, &mapping, &base, &slots, &slot_size,
                                     &shape_at, &py_start))
        return NULL;
    if (slots <= 0 || (slots & (slots - 1)) != 0) return PyErr_Format(PyExc_ValueError, "slots must be a power of two");
    if (slot_size <= HEAD || slot_size - HEAD > 65535) return PyErr_Format(PyExc_ValueError, "bad slot size");
    if (base < 0 || slots > (PY_SSIZE_T_MAX - base) / slot_size)
        return PyErr_Format(PyExc_ValueError, "bad header size");
    SlotWriter *self = (SlotWriter *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    if (PyObject_GetBuffer(mapping, &self->buf, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->held = 1;
    if (self->buf.len < base + slots * slot_size) {
        sw_release(self, NULL);
        Py_DECREF(self);
        return PyErr_Format(PyExc_ValueError, "the mapping is smaller than the ring");
    }
    self->base = base;
    self->mask = slots - 1;
    self->slot_size = slot_size;
    self->shape_at = shape_at;
    Py_INCREF(py_start);
    self->py_start = py_start;
    return (PyObject *)self;
}

static void sw_dealloc(SlotWriter *self) {
    sw_release(self, NULL);
    Py_XDECREF(self->py_start);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject SlotWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commviz._fastpack.SlotWriter",
    .tp_basicsize = sizeof(SlotWriter),
    .tp_dealloc = (destructor)sw_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = sw_methods,
    .tp_members = sw_members,
    .tp_new = sw_new,
};

/* ---- frames */

/* ---- folded ops: a blocking op's start with its end's time as one more item
   (probe/_fastwrap.c), written as the two events it stands for. events.py sets the
   fold from its own records (set_fold): the end's head bytes (array length and tag),
   then its id and time are packed, then its tail bytes (error, bytes, peer). */

static PyObject *fold_tag; /* what a folded record holds first, compared by identity; NULL: no fold */
static Py_ssize_t fold_len, fold_id; /* a start's items and where its id is */
#define FOLD_HEAD_MAX 16 /* each fixed part's bytes, at most: copied whole */
static char fold_start[FOLD_HEAD_MAX], fold_head[FOLD_HEAD_MAX], fold_tail[FOLD_HEAD_MAX];
static Py_ssize_t fold_start_n, fold_head_n, fold_tail_n;

INLINE int is_folded(PyObject *ev) {
    return fold_tag != NULL && PyList_CheckExact(ev) && PyList_GET_SIZE(ev) == fold_len + 1 &&
           PyList_GET_ITEM(ev, 0) == fold_tag;
}

/* a folded op's two events; FOREIGN where its id or time is not an int of 64 bits */
static int pack_folded(Out *o, PyObject *ev) {
    PyObject **items = PySequence_Fast_ITEMS(ev), *id = items[fold_id], *t = items[fold_len];
    if (!PyLong_CheckExact(id) || !PyLong_CheckExact(t)) return FOREIGN;
    int r = reserve(o, 0); /* from here to the next check, what is written fits in the slack */
    if (r != OK) return r;
    memcpy(o->p, fold_start, FOLD_HEAD_MAX); /* the start's array head and tag (a fixed copy: no call) */
    o->p += fold_start_n;
    for (Py_ssize_t i = 1; i < fold_len && r == OK; i++) {
        PyObject *v = items[i];
        PyTypeObject *tp = Py_TYPE(v);
        if (tp == &PyLong_Type) /* at most 9 bytes: in the slack of the last check */
            r = w_int(o, v);
        else if (tp == &PyUnicode_Type)
            r = pack_str(o, v); /* checks for room itself, and leaves the slack after it, as pack_value does */
        else if (tp == &PyBool_Type)
            *o->p++ = v == Py_True ? 0xc3 : 0xc2;
        else
            r = pack_value(o, v, 0);
    }
    if (r != OK) return r;
    memcpy(o->p, fold_head, FOLD_HEAD_MAX);
    o->p += fold_head_n;
    if ((r = w_int(o, id)) != OK) return r;
    if ((r = w_int(o, t)) != OK) return r;
    memcpy(o->p, fold_tail, FOLD_HEAD_MAX);
    o->p += fold_tail_n;
    return OK;
}

static Py_ssize_t events_of(PyObject *events) {
    Py_ssize_t n = PyList_GET_SIZE(events);
    if (fold_tag != NULL)
        for (Py_ssize_t i = 0, k = n; i < k; i++) n += is_folded(PyList_GET_ITEM(events, i));
    return n;
}

/* set_fold(tag, start_head, end_head, end_tail, start_len, id_at): a list of
   start_len + 1 items whose first is tag is a folded op, written as start_head (the
   start's array head and tag), its items after the tag, then end_head, its id and
   its last item (the end's time), end_tail. set_fold(None, b"", b"", b"", 0, 0):
   nothing is folded. */
static PyObject *set_fold(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyBytes_Check(args[1]) || !PyBytes_Check(args[2]) || !PyBytes_Check(args[3]))
        return PyErr_Format(PyExc_TypeError, "set_fold(tag, start_head, end_head, end_tail, start_len, id_at)");
    Py_ssize_t sn = PyBytes_GET_SIZE(args[1]), hn = PyBytes_GET_SIZE(args[2]), tn = PyBytes_GET_SIZE(args[3]);
    Py_ssize_t len = PyLong_AsSsize_t(args[4]), at = PyLong_AsSsize_t(args[5]);
    if ((len == -1 || at == -1) && PyErr_Occurred()) return NULL;
    if (sn > (Py_ssize_t)sizeof fold_start || hn > (Py_ssize_t)sizeof fold_head || tn > (Py_ssize_t)sizeof fold_tail ||
        (args[0] != Py_None && (len < 2 || len > 16 || at < 1 || at >= len)))
        return PyErr_Format(PyExc_ValueError, "a fold that does not fit");
    Py_CLEAR(fold_tag);
    if (args[0] == Py_None) Py_RETURN_NONE;
    memcpy(fold_start, PyBytes_AS_STRING(args[1]), (size_t)sn);
    memcpy(fold_head, PyBytes_AS_STRING(args[2]), (size_t)hn);
    memcpy(fold_tail, PyBytes_AS_STRING(args[3]), (size_t)tn);
    fold_start_n = sn;
    fold_head_n = hn;
    fold_tail_n = tn;
    fold_id = at;
    fold_len = len;
    Py_INCREF(args[0]);
    fold_tag = args[0];
    Py_RETURN_NONE;
}

/* events_in(records) -> the events they stand for (a folded op is two) */
static PyObject *events_in(PyObject *mod, PyObject *events) {
    if (!PyList_CheckExact(events)) return PyErr_Format(PyExc_TypeError, "events_in(list)");
    return PyLong_FromSsize_t(events_of(events));
}

/* out.append(i); 0 or -1 */
static int append_index(PyObject *out, Py_ssize_t i) {
    PyObject *v = PyLong_FromSsize_t(i);
    int r = v == NULL ? -1 : PyList_Append(out, v);
    Py_XDECREF(v);
    return r;
}

/* cuts(records, most) -> [end, ...]: the ends of runs of records, in order, that
   stand for at most `most` events each (a folded op is two, never cut apart) */
static PyObject *cuts(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0])) return PyErr_Format(PyExc_TypeError, "cuts(records, most)");
    Py_ssize_t most = PyLong_AsSsize_t(args[1]);
    if (most == -1 && PyErr_Occurred()) return NULL;
    if (most < 2) return PyErr_Format(PyExc_ValueError, "most must be 2 or more");
    PyObject *events = args[0], *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(events), in_run = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = 1 + is_folded(PyList_GET_ITEM(events, i));
        if (in_run + k > most) {
            if (append_index(out, i) < 0) goto fail;
            in_run = 0;
        }
        in_run += k;
    }
    if (n > 0 && append_index(out, n) < 0) goto fail;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* encode_batch(schema, rank, events, encode_one) -> bytes: what msgspec writes for
   Batch(schema, rank, events); an event that is not a record of plain values is
   encode_one(event)'s bytes (msgspec's, which also raises for what it cannot encode).
   NotImplemented where the frame's head is not a list and two ints of 64 bits: the
   caller encodes that one with msgspec. */
static PyObject *encode_batch(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) return PyErr_Format(PyExc_TypeError, "encode_batch(schema, rank, events, encode_one)");
    if (!PyList_CheckExact(args[2]) || !PyLong_CheckExact(args[0]) || !PyLong_CheckExact(args[1]))
        Py_RETURN_NOTIMPLEMENTED; /* the caller's msgspec encodes it, whatever it is */
    PyObject *events = args[2], *encode_one = args[3];
    Py_ssize_t cap = 64 + 96 * PyList_GET_SIZE(events) + SLACK;
    Out o = {NULL, NULL, NULL, PyBytes_FromStringAndSize(NULL, cap)};
    if (o.bytes == NULL) return NULL;
    o.p = o.start = (uint8_t *)PyBytes_AS_STRING(o.bytes);
    o.end = o.start + cap;
    *o.p++ = 0x93; /* the slack is room for the head */
    int r = w_int(&o, args[0]);
    if (r == OK) r = w_int(&o, args[1]);
    if (r == FOREIGN) { /* past 64 bits: msgspec's to say */
        Py_DECREF(o.bytes);
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (r == OK) r = pack_len(&o, events_of(events));
    if (r != OK) goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        size_t at = o.p - o.start;
        r = FOREIGN;
        if (is_folded(ev)) {
            if ((r = pack_folded(&o, ev)) == FOREIGN) { /* two events from one record: Python unfolds it */
                Py_DECREF(o.bytes);
                Py_RETURN_NOTIMPLEMENTED;
            }
        } else if (PyTuple_CheckExact(ev))
            r = pack_items(&o, &PyTuple_GET_ITEM(ev, 0), PyTuple_GET_SIZE(ev), 0, -1);
        else if (PyList_CheckExact(ev))
            r = pack_items(&o, PySequence_Fast_ITEMS(ev), PyList_GET_SIZE(ev), 0, -1);
        if (r == NOMEM) goto fail;
        if (r == FOREIGN) {
            o.p = o.start + at;
            Py_INCREF(ev); /* encode_one runs Python */
            PyObject *b = PyObject_CallOneArg(encode_one, ev);
            Py_DECREF(ev);
            if (b == NULL) goto fail;
            if (!PyBytes_Check(b)) {
                Py_DECREF(b);
                PyErr_SetString(PyExc_TypeError, "encode_one must return bytes");
                goto fail;
            }
            r = reserve(&o, (size_t)PyBytes_GET_SIZE(b));
            if (r == OK) {
                memcpy(o.p, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
                o.p += PyBytes_GET_SIZE(b);
            }
            Py_DECREF(b);
            if (r != OK) goto fail;
        }
    }
    if (_PyBytes_Resize(&o.bytes, o.p - o.start) < 0) return NULL; /* shrinks in place: no copy */
    return o.bytes;
fail:
    Py_XDECREF(o.bytes); /* NULL where a resize failed and freed it */
    return PyErr_Occurred() ? NULL : PyErr_NoMemory();
}

static PyMethodDef module_methods[] = {
    {"encode_batch", (PyCFunction)(void (*)(void))encode_batch, METH_FASTCALL, "a frame, as msgspec encodes a Batch"},
    {"set_fold", (PyCFunction)(void (*)(void))set_fold, METH_FASTCALL, "how a folded op's end is written"},
    {"events_in", (PyCFunction)events_in, METH_O, "the events a list of records stands for"},
    {"cuts", (PyCFunction)(void (*)(void))cuts, METH_FASTCALL, "where to cut records into runs of at most N events"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpack", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__fastpack(void) {
    if (PyType_Ready(&SlotWriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddStringConstant(m, "SLOT_HEAD", SLOT_HEAD_FORMAT) < 0 ||
        PyModule_AddStringConstant(m, "END_HEAD", END_HEAD_FORMAT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&SlotWriterType);
    if (PyModule_AddObject(m, "SlotWriter", (PyObject *)&SlotWriterType) < 0) {
        Py_DECREF(&SlotWriterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
