/* A batch's columns read from its event objects in one pass (model/columns.py's Chunk).
 *
 * In Python each field of each event is an attribute read through a map/attrgetter
 * chain (~40-70 ns), and each start's signature a tuple built and looked up in a dict:
 * about half a microsecond an event, a quarter of what the batch path costs live.
 * msgspec Structs keep their fields in slots at fixed offsets, named by the member
 * descriptors on their type, so here a field is a pointer read. The offsets are taken
 * from those descriptors at bind time (a descriptor of any other kind is refused, and
 * Python does the work); a slot found empty raises, and Python does the work.
 *
 * Builds with nothing but the Python headers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <string.h>

enum { START = 0, END = 1, QUIET = 2, OTHER = 3 };
enum { S_ID, S_T, S_SEQ, S_OP, S_GROUP, S_BYTES, S_DTYPE, S_ROOT, S_REDUCE, S_N };
enum { E_ID, E_T, E_ERROR, E_BYTES, E_DEVICE, E_CAPTURED, E_FIRST, E_N };

static PyTypeObject *start_type, *end_type;
static PyObject *quiet_types; /* a tuple of types */
static Py_ssize_t s_off[S_N], e_off[E_N];

static int offsets_of(PyObject *descrs, Py_ssize_t *out, Py_ssize_t n) {
    if (!PyTuple_Check(descrs) || PyTuple_GET_SIZE(descrs) != n) {
        PyErr_SetString(PyExc_TypeError, "expected a tuple of member descriptors");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyTuple_GET_ITEM(descrs, i);
        if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
            PyErr_SetString(PyExc_TypeError, "not a member descriptor");
            return -1;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX) {
            PyErr_SetString(PyExc_TypeError, "a member that is not an object slot");
            return -1;
        }
        out[i] = m->offset;
    }
    return 0;
}

/* bind(OpStart, OpEnd, quiet types, start descriptors, end descriptors) */
static PyObject *bind(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *st, *et, *qt, *sd, *ed;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!", &PyType_Type, &st, &PyType_Type, &et, &PyTuple_Type, &qt,
                          &PyTuple_Type, &sd, &PyTuple_Type, &ed))
        return NULL;
    if (offsets_of(sd, s_off, S_N) < 0 || offsets_of(ed, e_off, E_N) < 0) return NULL;
    Py_INCREF(st);
    Py_INCREF(et);
    Py_INCREF(qt);
    Py_XSETREF(start_type, (PyTypeObject *)st);
    Py_XSETREF(end_type, (PyTypeObject *)et);
    Py_XSETREF(quiet_types, qt);
    Py_RETURN_NONE;
}

static inline PyObject *slot(PyObject *ev, Py_ssize_t off) {
    PyObject *v = *(PyObject **)((char *)ev + off);
    if (v == NULL) PyErr_SetString(PyExc_AttributeError, "an event with an empty field");
    return v;
}

static inline int as_i64(PyObject *v, long long *out) {
    if (v == NULL) return -1;
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

/* The code of `key` in `table` (dict key -> code), adding it to `table` and `keys`
 * (the distinct keys, first seen first) when new. Steals `key`. */
static long long intern(PyObject *table, PyObject *keys, PyObject *key) {
    if (key == NULL) return -1;
    PyObject *code = PyDict_GetItemWithError(table, key);
    long long c;
    if (code != NULL) {
        c = PyLong_AsLongLong(code);
    } else if (PyErr_Occurred()) {
        c = -1;
    } else {
        c = PyList_GET_SIZE(keys);
        PyObject *n = PyLong_FromLongLong(c);
        if (n == NULL || PyDict_SetItem(table, key, n) < 0 || PyList_Append(keys, key) < 0) c = -1;
        Py_XDECREF(n);
    }
    Py_DECREF(key);
    return c;
}

static PyObject *tuple_of(PyObject *ev, const Py_ssize_t *offs, const int *which, int n) {
    PyObject *t = PyTuple_New(n);
    if (t == NULL) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v = slot(ev, offs[which[i]]);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        Py_INCREF(v);
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static int writable(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t n) {
    if (PyObject_GetBuffer(o, b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (b->itemsize != itemsize || b->len != itemsize * n) {
        PyBuffer_Release(b);
        PyErr_SetString(PyExc_ValueError, "a column of the wrong size");
        return -1;
    }
    return 0;
}

static const int SIG[] = {S_OP, S_GROUP, S_BYTES, S_DTYPE, S_ROOT, S_REDUCE};
static const int TAIL[] = {E_ERROR, E_BYTES, E_DEVICE, E_CAPTURED, E_FIRST};

static int read_one(PyObject *ev, Py_ssize_t i, signed char *kind, long long *ident, long long *t, long long *seq,
                    long long *sig, long long *tail, PyObject *st, PyObject *sk, PyObject *tt, PyObject *tk) {
    PyTypeObject *tp = Py_TYPE(ev);
    if (tp == start_type) {
        kind[i] = START;
        if (as_i64(slot(ev, s_off[S_ID]), &ident[i]) < 0 || as_i64(slot(ev, s_off[S_T]), &t[i]) < 0 ||
            as_i64(slot(ev, s_off[S_SEQ]), &seq[i]) < 0)
            return -1;
        return (sig[i] = intern(st, sk, tuple_of(ev, s_off, SIG, 6))) < 0;
    }
    if (tp == end_type) {
        kind[i] = END;
        if (as_i64(slot(ev, e_off[E_ID]), &ident[i]) < 0 || as_i64(slot(ev, e_off[E_T]), &t[i]) < 0) return -1;
        return (tail[i] = intern(tt, tk, tuple_of(ev, e_off, TAIL, 5))) < 0;
    }
    kind[i] = OTHER;
    for (Py_ssize_t q = 0; q < PyTuple_GET_SIZE(quiet_types); q++)
        if ((PyObject *)tp == PyTuple_GET_ITEM(quiet_types, q)) {
            kind[i] = QUIET;
            break;
        }
    return 0;
}

/* fill(store, kind int8, id, t, seq, sig, tail int64 [len(store)], sig table, sig keys,
 * tail table, tail keys): what Chunk reads of each event, in store order. id and t for
 * starts and ends, seq and sig for starts, tail for ends; the other cells are left. */
static PyObject *fill(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "fill takes 11 arguments");
        return NULL;
    }
    if (start_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "not bound");
        return NULL;
    }
    PyObject *store = args[0];
    if (!PyList_Check(store) && !PyTuple_Check(store)) {
        PyErr_SetString(PyExc_TypeError, "store must be a list or a tuple");
        return NULL;
    }
    PyObject *st = args[7], *sk = args[8], *tt = args[9], *tk = args[10];
    if (!PyDict_CheckExact(st) || !PyList_CheckExact(sk) || !PyDict_CheckExact(tt) || !PyList_CheckExact(tk)) {
        PyErr_SetString(PyExc_TypeError, "tables must be dicts, keys lists");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(store);
    Py_buffer b[6];
    int got = 0;
    for (; got < 6; got++)
        if (writable(args[1 + got], &b[got], got == 0 ? 1 : 8, n) < 0) break;
    PyObject *ret = NULL;
    if (got < 6) goto done;
    signed char *kind = b[0].buf;
    long long *ident = b[1].buf, *t = b[2].buf, *seq = b[3].buf, *sig = b[4].buf, *tail = b[5].buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* A field's __eq__ may run Python (an event built by hand, not decoded): read
         * the list afresh each time and hold the event while it is read. */
        if (i >= PySequence_Fast_GET_SIZE(store)) {
            PyErr_SetString(PyExc_RuntimeError, "the store changed while it was read");
            goto done;
        }
        PyObject *ev = PySequence_Fast_GET_ITEM(store, i);
        Py_INCREF(ev);
        int bad = read_one(ev, i, kind, ident, t, seq, sig, tail, st, sk, tt, tk);
        Py_DECREF(ev);
        if (bad) goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    return ret;
}

/* ---- A frame decoded straight into columns (model/store.py) ----
 *
 * msgspec builds a Struct, its ints and its strings for every event, and the batch
 * path then reads them back into columns: two thirds of what the watcher spends on an
 * event. Here the frame's msgpack is read once and each start and end becomes a row
 * of int64 columns; a start's signature (op, group, bytes, dtype, root, reduce_op)
 * is built as a tuple once per distinct signature in the frame. Any other event is
 * handed to msgspec (`decode_one`) and kept as an object.
 *
 * It accepts only what msgspec accepts and reads it as msgspec would: anything it is
 * not sure of (a type it does not expect, an int past 64 bits, an error string, an
 * event msgspec refuses) declines the whole frame (None), and msgspec decodes it,
 * with msgspec's errors. */
enum { R_KIND, R_ID, R_T, R_SEQ, R_SIG, R_ERR, R_EBYTES, R_DEV, R_OFF, R_LEN, R_N };
#define MAX_SIGS 64 /* distinct signatures a frame may hold (more: msgspec reads it) */
#define MAX_DEPTH 64

typedef struct {
    const unsigned char *p, *e;
} Cur;

static inline unsigned long long be(const unsigned char *q, int n) {
    unsigned long long v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | q[i];
    return v;
}

static int rd_int(Cur *c, long long *v) {
    if (c->p >= c->e) return -1;
    unsigned char b = *c->p;
    const unsigned char *q = c->p + 1;
    Py_ssize_t left = c->e - q;
    int n;
    if (b <= 0x7f) {
        *v = b;
        n = 0;
    } else if (b >= 0xe0) {
        *v = (signed char)b;
        n = 0;
    } else {
        switch (b) {
        case 0xcc: n = 1; break;
        case 0xcd: n = 2; break;
        case 0xce: n = 4; break;
        case 0xcf: n = 8; break;
        case 0xd0: n = 1; break;
        case 0xd1: n = 2; break;
        case 0xd2: n = 4; break;
        case 0xd3: n = 8; break;
        default: return -1;
        }
        if (left < n) return -1;
        unsigned long long u = be(q, n);
        if (b <= 0xcf) {
            if (u > (unsigned long long)LLONG_MAX) return -1; /* msgspec takes it; the columns cannot */
            *v = (long long)u;
        } else if (n == 1) {
            *v = (signed char)u;
        } else if (n == 2) {
            *v = (short)u;
        } else if (n == 4) {
            *v = (int)u;
        } else {
            *v = (long long)u;
        }
    }
    c->p = q + n;
    return 0;
}

static int rd_str(Cur *c, const char **s, Py_ssize_t *len) {
    if (c->p >= c->e) return -1;
    unsigned char b = *c->p;
    const unsigned char *q = c->p + 1;
    Py_ssize_t n;
    if (b >= 0xa0 && b <= 0xbf) {
        n = b & 0x1f;
    } else {
        int h = b == 0xd9 ? 1 : b == 0xda ? 2 : b == 0xdb ? 4 : 0;
        if (!h || c->e - q < h) return -1;
        unsigned long long u = be(q, h);
        q += h;
        if (u > (unsigned long long)(c->e - q)) return -1; /* compared unsigned: no negative size */
        n = (Py_ssize_t)u;
    }
    if (c->e - q < n) return -1;
    *s = (const char *)q;
    *len = n;
    c->p = q + n;
    return 0;
}

static int rd_arr(Cur *c, Py_ssize_t *n) {
    if (c->p >= c->e) return -1;
    unsigned char b = *c->p;
    const unsigned char *q = c->p + 1;
    if (b >= 0x90 && b <= 0x9f) {
        *n = b & 0x0f;
    } else {
        int h = b == 0xdc ? 2 : b == 0xdd ? 4 : 0;
        if (!h || c->e - q < h) return -1;
        unsigned long long u = be(q, h);
        q += h;
        if (u > (unsigned long long)(c->e - q)) return -1; /* each item takes a byte at least */
        *n = (Py_ssize_t)u;
    }
    c->p = q;
    return 0;
}

static int rd_bool(Cur *c, long long *v) {
    if (c->p >= c->e || (*c->p != 0xc2 && *c->p != 0xc3)) return -1;
    *v = *c->p == 0xc3;
    c->p++;
    return 0;
}

/* Past one value of any type (its extent only; msgspec judges it). */
static int skip(Cur *c, int depth) {
    if (c->p >= c->e || depth > MAX_DEPTH) return -1;
    unsigned char b = *c->p;
    const unsigned char *q = c->p + 1;
    Py_ssize_t n = 0, items = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        c->p = q;
        return 0;
    }
    if (b >= 0x80 && b <= 0x8f) items = 2 * (b & 0x0f);
    else if (b >= 0x90 && b <= 0x9f) items = b & 0x0f;
    else if (b >= 0xa0 && b <= 0xbf) n = b & 0x1f;
    else {
        int h = 0, fixed = -1, ext = 0, kind = 0; /* kind: 0 bytes, 1 array, 2 map */
        switch (b) {
        case 0xc4: case 0xd9: h = 1; break;
        case 0xc5: case 0xda: h = 2; break;
        case 0xc6: case 0xdb: h = 4; break;
        case 0xc7: h = 1; ext = 1; break;
        case 0xc8: h = 2; ext = 1; break;
        case 0xc9: h = 4; ext = 1; break;
        case 0xca: fixed = 4; break;
        case 0xcb: fixed = 8; break;
        case 0xcc: case 0xd0: fixed = 1; break;
        case 0xcd: case 0xd1: fixed = 2; break;
        case 0xce: case 0xd2: fixed = 4; break;
        case 0xcf: case 0xd3: fixed = 8; break;
        case 0xd4: fixed = 2; break;
        case 0xd5: fixed = 3; break;
        case 0xd6: fixed = 5; break;
        case 0xd7: fixed = 9; break;
        case 0xd8: fixed = 17; break;
        case 0xdc: h = 2; kind = 1; break;
        case 0xdd: h = 4; kind = 1; break;
        case 0xde: h = 2; kind = 2; break;
        case 0xdf: h = 4; kind = 2; break;
        default: return -1;
        }
        if (fixed >= 0) {
            n = fixed;
        } else {
            if (c->e - q < h) return -1;
            unsigned long long u = be(q, h);
            q += h;
            if (u > (unsigned long long)(c->e - q)) return -1; /* a size or count past the frame */
            Py_ssize_t v = (Py_ssize_t)u;
            if (kind == 1) items = v;
            else if (kind == 2) items = 2 * v;
            else n = v + ext;
        }
    }
    if (c->e - q < n) return -1;
    c->p = q + n;
    for (Py_ssize_t i = 0; i < items; i++)
        if (skip(c, depth + 1) < 0) return -1;
    return 0;
}

typedef struct {
    const char *s[4]; /* op, group, dtype, reduce_op */
    Py_ssize_t n[4];
    long long bytes, root;
} Sig;

static int same_sig(const Sig *a, const Sig *b) {
    if (a->bytes != b->bytes || a->root != b->root) return 0;
    for (int i = 0; i < 4; i++)
        if (a->n[i] != b->n[i] || memcmp(a->s[i], b->s[i], a->n[i])) return 0;
    return 1;
}

static PyObject *sig_tuple(const Sig *g) {
    PyObject *op = PyUnicode_DecodeUTF8(g->s[0], g->n[0], NULL);
    PyObject *group = op ? PyUnicode_DecodeUTF8(g->s[1], g->n[1], NULL) : NULL;
    PyObject *dtype = group ? PyUnicode_DecodeUTF8(g->s[2], g->n[2], NULL) : NULL;
    PyObject *red = dtype ? PyUnicode_DecodeUTF8(g->s[3], g->n[3], NULL) : NULL;
    PyObject *t = red ? Py_BuildValue("(OOLOLO)", op, group, g->bytes, dtype, g->root, red) : NULL;
    Py_XDECREF(op);
    Py_XDECREF(group);
    Py_XDECREF(dtype);
    Py_XDECREF(red);
    return t;
}

static const char EMPTY[] = "";

/* Signatures seen in earlier frames, their tuples kept: a job's frames repeat a few
 * signatures, so a frame's are nearly always found here (by their bytes) and shared,
 * which spares their strings and lets a reader match them by identity. */
#define CACHED 32
#define KEY_MAX 192
typedef struct {
    Py_ssize_t len;
    char key[KEY_MAX];
    PyObject *tuple;
} Cached;
static Cached cache[CACHED];
static int cache_next;
static PyObject *last_sigs; /* the tuple of signatures the last frame returned */

/* g's bytes as one key; -1 if they do not fit. */
static Py_ssize_t sig_key(const Sig *g, char *key) {
    Py_ssize_t n = 0;
    for (int i = 0; i < 4; i++) {
        if (n + (Py_ssize_t)sizeof(Py_ssize_t) + g->n[i] > KEY_MAX - 2 * (Py_ssize_t)sizeof(long long)) return -1;
        memcpy(key + n, &g->n[i], sizeof(Py_ssize_t));
        n += sizeof(Py_ssize_t);
        memcpy(key + n, g->s[i], g->n[i]);
        n += g->n[i];
    }
    memcpy(key + n, &g->bytes, sizeof(long long));
    n += sizeof(long long);
    memcpy(key + n, &g->root, sizeof(long long));
    return n + sizeof(long long);
}

/* g's tuple, from the cache or made (and cached); a new reference. */
static PyObject *sig_cached(const Sig *g) {
    char key[KEY_MAX];
    Py_ssize_t n = sig_key(g, key);
    if (n >= 0)
        for (int i = 0; i < CACHED; i++)
            if (cache[i].tuple != NULL && cache[i].len == n && !memcmp(cache[i].key, key, n)) {
                Py_INCREF(cache[i].tuple);
                return cache[i].tuple;
            }
    PyObject *t = sig_tuple(g);
    if (t != NULL && n >= 0) {
        Cached *c = &cache[cache_next];
        cache_next = (cache_next + 1) % CACHED;
        Py_XSETREF(c->tuple, t);
        Py_INCREF(t);
        c->len = n;
        memcpy(c->key, key, n);
    }
    return t;
}

/* A start's fields after its tag (k of them), its row filled but for its signature. */
static int rd_start(Cur *c, Py_ssize_t k, long long *row, Sig *g) {
    long long x;
    g->s[2] = g->s[3] = EMPTY;
    g->n[2] = g->n[3] = 0;
    g->root = -1;
    if (rd_int(c, &row[R_ID]) || rd_int(c, &row[R_T]) || rd_str(c, &g->s[0], &g->n[0]) ||
        rd_str(c, &g->s[1], &g->n[1]) || rd_int(c, &row[R_SEQ]) || rd_int(c, &g->bytes))
        return -1;
    for (Py_ssize_t j = 6; j < k; j++) {
        switch (j) {
        case 6: if (rd_str(c, &g->s[2], &g->n[2])) return -1; break;
        case 7: {
            Py_ssize_t m;
            if (rd_arr(c, &m)) return -1;
            for (Py_ssize_t i = 0; i < m; i++)
                if (rd_int(c, &x)) return -1;
            break;
        }
        case 9: if (rd_int(c, &g->root)) return -1; break;
        case 10: case 12: if (rd_bool(c, &x)) return -1; break;
        case 11: if (rd_str(c, &g->s[3], &g->n[3])) return -1; break;
        default: if (rd_int(c, &x)) return -1; break; /* peer, bucket, params */
        }
    }
    return 0;
}

static int rd_end(Cur *c, Py_ssize_t k, long long *row) {
    long long x;
    const char *s;
    Py_ssize_t n;
    if (rd_int(c, &row[R_ID]) || rd_int(c, &row[R_T])) return -1;
    for (Py_ssize_t j = 2; j < k; j++) {
        switch (j) {
        case 2: /* an error goes the per-event way, read by msgspec */
            if (rd_str(c, &s, &n) || n) return -1;
            break;
        case 3: if (rd_int(c, &row[R_EBYTES])) return -1; break;
        case 5: if (rd_int(c, &row[R_DEV])) return -1; break;
        case 7: if (rd_bool(c, &row[R_ERR])) return -1; break; /* captured: untimed */
        case 8: /* first on its communicator: untimed too */
            if (rd_bool(c, &x)) return -1;
            row[R_ERR] |= x;
            break;
        default: if (rd_int(c, &x)) return -1; break; /* peer, enqueue_ns */
        }
    }
    return 0;
}

/* frame(payload: bytes, max_schema: int, decode_one) -> None, or (schema, rank,
 * rows: bytes of R_N int64 per event, sigs: the frame's distinct signatures, objs:
 * the events that are neither starts nor ends, decoded by decode_one, tmax: the
 * latest time of a start or an end, LLONG_MIN if none, count: its events). A start's
 * R_SIG is its signature's index in sigs (a tuple); another event's R_OFF its index in objs (None if none)
 * (R_LEN -1); a start's or end's R_OFF and R_LEN its bytes in the payload. */
static PyObject *frame(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "frame(payload: bytes, max_schema: int, decode_one)");
        return NULL;
    }
    if (start_type == NULL) Py_RETURN_NONE;
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Cur c = {base, base + PyBytes_GET_SIZE(args[0])};
    long long max_schema = PyLong_AsLongLong(args[1]), schema, rank;
    if (max_schema == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t outer, m;
    if (rd_arr(&c, &outer) || outer != 3 || rd_int(&c, &schema) || schema > max_schema || rd_int(&c, &rank) ||
        rank < 0 || rd_arr(&c, &m) || m > (c.e - c.p))
        Py_RETURN_NONE;
    PyObject *rows = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)m * R_N * 8);
    PyObject *sigs = PyList_New(0), *objs = PyList_New(0);
    PyObject *ret = NULL;
    Sig seen[MAX_SIGS];
    int nsig = 0, last = 0, declined = 0;
    long long tmax = LLONG_MIN; /* the latest start's or end's time (a merge's frontier) */
    if (rows == NULL || sigs == NULL || objs == NULL) goto done;
    long long *row = (long long *)PyBytes_AS_STRING(rows);
    for (Py_ssize_t i = 0; i < m; i++, row += R_N) {
        const unsigned char *at = c.p;
        Py_ssize_t k;
        const char *tag;
        Py_ssize_t tn;
        row[R_ID] = -1; row[R_T] = 0; row[R_SEQ] = -1; row[R_SIG] = -1;
        row[R_ERR] = 0; row[R_EBYTES] = -1; row[R_DEV] = -1;
        row[R_OFF] = at - base;
        if (rd_arr(&c, &k) || k < 1 || rd_str(&c, &tag, &tn)) goto decline;
        if (tn == 5 && !memcmp(tag, "start", 5) && k >= 7 && k <= 16) {
            Sig g;
            row[R_KIND] = START;
            if (rd_start(&c, k - 1, row, &g)) goto decline;
            int hit = -1;
            if (nsig && same_sig(&seen[last], &g)) hit = last;
            for (int q = 0; hit < 0 && q < nsig; q++)
                if (same_sig(&seen[q], &g)) hit = q;
            if (hit < 0) {
                if (nsig == MAX_SIGS) goto decline;
                PyObject *t = sig_cached(&g);
                if (t == NULL) {
                    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                        PyErr_Clear();
                        goto decline;
                    }
                    goto done;
                }
                int bad = PyList_Append(sigs, t);
                Py_DECREF(t);
                if (bad) goto done;
                seen[nsig] = g;
                hit = nsig++;
            }
            last = hit;
            row[R_SIG] = hit;
            row[R_LEN] = c.p - at;
            if (row[R_T] > tmax) tmax = row[R_T];
        } else if (tn == 3 && !memcmp(tag, "end", 3) && k >= 3 && k <= 10) {
            row[R_KIND] = END;
            if (rd_end(&c, k - 1, row)) goto decline;
            row[R_LEN] = c.p - at;
            if (row[R_T] > tmax) tmax = row[R_T];
        } else {
            c.p = at;
            if (skip(&c, 0)) goto decline;
            PyObject *one = PyBytes_FromStringAndSize((const char *)at, c.p - at);
            PyObject *ev = one ? PyObject_CallOneArg(args[2], one) : NULL;
            Py_XDECREF(one);
            if (ev == NULL) {
                if (PyErr_ExceptionMatches(PyExc_MemoryError)) goto done;
                PyErr_Clear();
                goto decline;
            }
            PyTypeObject *tp = Py_TYPE(ev);
            row[R_KIND] = OTHER;
            for (Py_ssize_t q = 0; q < PyTuple_GET_SIZE(quiet_types); q++)
                if ((PyObject *)tp == PyTuple_GET_ITEM(quiet_types, q)) row[R_KIND] = QUIET;
            row[R_OFF] = PyList_GET_SIZE(objs);
            row[R_LEN] = -1;
            int bad = tp == start_type || tp == end_type || PyList_Append(objs, ev) < 0;
            Py_DECREF(ev);
            if (bad) {
                if (PyErr_Occurred()) goto done;
                goto decline;
            }
        }
        continue;
    decline:
        declined = 1;
        break;
    }
    if (declined || c.p != c.e) {
        ret = Py_None;
        Py_INCREF(ret);
    } else {
        /* a tuple of signatures and None for no objects: most frames then add no
         * object the cyclic collector tracks but the rows */
        PyObject *st = NULL;
        Py_ssize_t ns = PyList_GET_SIZE(sigs);
        if (last_sigs != NULL && PyTuple_GET_SIZE(last_sigs) == ns) { /* the same as the last frame's: shared */
            st = last_sigs;
            for (Py_ssize_t q = 0; q < ns; q++)
                if (PyTuple_GET_ITEM(last_sigs, q) != PyList_GET_ITEM(sigs, q)) st = NULL;
            Py_XINCREF(st);
        }
        if (st == NULL) {
            st = PyList_AsTuple(sigs);
            if (st != NULL) {
                Py_INCREF(st);
                Py_XSETREF(last_sigs, st);
            }
        }
        ret = st ? Py_BuildValue("(LLOOOLn)", schema, rank, rows, st, PyList_GET_SIZE(objs) ? objs : Py_None, tmax, m)
                 : NULL;
        Py_XDECREF(st);
    }
done:
    Py_XDECREF(rows);
    Py_XDECREF(sigs);
    Py_XDECREF(objs);
    return ret;
}

/* heads(block, start, end, max_frame, tag) -> (rows, stop, too_long): the first
 * pass over a trace file (trace/stream.py), which wants of each frame only where it
 * lies, its rank and whether it holds a hello: in Python that loop is most of the
 * pass. Walks the frames lying whole in block[start:end]; rows holds 4 int64 per
 * frame: its offset in the block, its payload's length, its rank (-1 where the
 * frame's head is not the plain [schema, rank, ...] Python's fast path reads too:
 * Python asks msgspec) and 1 if `tag` occurs in the payload. Stops at the first
 * frame not whole in the block (stop is its offset) or, too_long set, at a length
 * over max_frame. */
static PyObject *heads(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "heads(block: bytes, start, end, max_frame, tag: bytes)");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    long long max_frame = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    const unsigned char *tag = (const unsigned char *)PyBytes_AS_STRING(args[4]);
    Py_ssize_t tn = PyBytes_GET_SIZE(args[4]);
    if (end > size) end = size;
    if (pos < 0 || tn < 1) {
        PyErr_SetString(PyExc_ValueError, "heads: a negative start or an empty tag");
        return NULL;
    }
    Py_ssize_t cap = 1024, m = 0;
    long long *rows = PyMem_Malloc(cap * 4 * sizeof(long long));
    if (rows == NULL) return PyErr_NoMemory();
    int too_long = 0;
    while (pos + 4 <= end) {
        long long n = (long long)b[pos] | ((long long)b[pos + 1] << 8) | ((long long)b[pos + 2] << 16) |
                      ((long long)b[pos + 3] << 24);
        if (n > max_frame) {
            too_long = 1;
            break;
        }
        if (pos + 4 + n > end) break;
        const unsigned char *p = b + pos + 4;
        long long rank = -1;
        if (n >= 5 && p[0] == 0x93 && p[1] <= 0x7F) {
            if (p[2] <= 0x7F) rank = p[2];
            else if (p[2] == 0xCC) rank = p[3];
            else if (p[2] == 0xCD) rank = ((long long)p[3] << 8) | p[4];
        }
        long long hello = 0;
        for (const unsigned char *q = p, *last = p + (n >= tn ? n - tn : -1); n >= tn && q <= last; q++) {
            q = memchr(q, tag[0], (size_t)(last - q + 1));
            if (q == NULL) break;
            if (memcmp(q, tag, (size_t)tn) == 0) {
                hello = 1;
                break;
            }
        }
        if (m == cap) {
            long long *more = PyMem_Realloc(rows, 2 * cap * 4 * sizeof(long long));
            if (more == NULL) {
                PyMem_Free(rows);
                return PyErr_NoMemory();
            }
            rows = more;
            cap *= 2;
        }
        long long *r = rows + 4 * m++;
        r[0] = pos;
        r[1] = n;
        r[2] = rank;
        r[3] = hello;
        pos += 4 + n;
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)rows, m * 4 * (Py_ssize_t)sizeof(long long));
    PyMem_Free(rows);
    if (out == NULL) return NULL;
    return Py_BuildValue("(Nni)", out, pos, too_long);
}

static PyMethodDef module_methods[] = {
    {"heads", (PyCFunction)(void (*)(void))heads, METH_FASTCALL, "where a block's whole frames lie, their ranks, "
     "which hold a tag"},
    {"bind", bind, METH_VARARGS, "the event types and their fields' member descriptors"},
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL, "a batch's columns from its events"},
    {"frame", (PyCFunction)(void (*)(void))frame, METH_FASTCALL, "a frame's columns from its msgpack"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcols", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__fastcols(void) { return PyModule_Create(&module); }
