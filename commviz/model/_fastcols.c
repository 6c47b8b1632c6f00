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

enum { START = 0, END = 1, QUIET = 2, OTHER = 3 };
enum { S_ID, S_T, S_SEQ, S_OP, S_GROUP, S_BYTES, S_DTYPE, S_ROOT, S_REDUCE, S_N };
enum { E_ID, E_T, E_ERROR, E_BYTES, E_DEVICE, E_CAPTURED, E_N };

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
static const int TAIL[] = {E_ERROR, E_BYTES, E_DEVICE, E_CAPTURED};

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
        return (tail[i] = intern(tt, tk, tuple_of(ev, e_off, TAIL, 4))) < 0;
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

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS, "the event types and their fields' member descriptors"},
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL, "a batch's columns from its events"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcols", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__fastcols(void) { return PyModule_Create(&module); }
