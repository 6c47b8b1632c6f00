/* The watcher's reader loop, the part pyzmq makes slow.
 *
 * Under a flood the reader's cost per frame is what pyzmq charges for it: a Frame
 * object (about 1.3 us on a 2-core box) or a getsockopt(RCVMORE) (about 1.2 us), one
 * of which is needed per message to know whether a peer sent more than one part. The
 * same work done here, on the same socket and the same libzmq that pyzmq loaded, is
 * a few hundred nanoseconds: two zmq_msg_recv calls and two bytes objects.
 *
 * libzmq is not linked: its functions are handed over by address from Python
 * (ctypes, on the library pyzmq itself loaded), so this builds with nothing but the
 * Python headers, and any libzmq 4.x pyzmq was built with works. No call blocks
 * (ZMQ_DONTWAIT), so the GIL is kept.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

/* zmq.h's zmq_msg_t: 64 opaque bytes, pointer-aligned. */
typedef struct {
    unsigned char _[64];
} __attribute__((aligned(sizeof(void *)))) zmq_msg_t;

#define ZMQ_DONTWAIT 1
#define ZMQ_SRCFD 2

typedef int (*msg_init_t)(zmq_msg_t *);
typedef int (*msg_recv_t)(zmq_msg_t *, void *, int);
typedef int (*msg_close_t)(zmq_msg_t *);
typedef void *(*msg_data_t)(zmq_msg_t *);
typedef size_t (*msg_size_t)(const zmq_msg_t *);
typedef int (*msg_more_t)(const zmq_msg_t *);
typedef int (*msg_get_t)(const zmq_msg_t *, int);
typedef int (*errno_t_)(void);

static msg_init_t z_init;
static msg_recv_t z_recv;
static msg_close_t z_close;
static msg_data_t z_data;
static msg_size_t z_size;
static msg_more_t z_more;
static msg_get_t z_get;
static errno_t_ z_errno;

static PyObject *bind_zmq(PyObject *self, PyObject *args) {
    unsigned long long a[8];
    if (!PyArg_ParseTuple(args, "KKKKKKKK", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7]))
        return NULL;
    for (int i = 0; i < 8; i++) {
        if (!a[i]) {
            PyErr_SetString(PyExc_ValueError, "a libzmq function address is 0");
            return NULL;
        }
    }
    z_init = (msg_init_t)(uintptr_t)a[0];
    z_recv = (msg_recv_t)(uintptr_t)a[1];
    z_close = (msg_close_t)(uintptr_t)a[2];
    z_data = (msg_data_t)(uintptr_t)a[3];
    z_size = (msg_size_t)(uintptr_t)a[4];
    z_more = (msg_more_t)(uintptr_t)a[5];
    z_get = (msg_get_t)(uintptr_t)a[6];
    z_errno = (errno_t_)(uintptr_t)a[7];
    Py_RETURN_NONE;
}

/* One part into m; 0, or the zmq errno (EAGAIN when nothing is waiting). */
static int recv_part(void *sock, zmq_msg_t *m) {
    for (;;) {
        z_init(m);
        if (z_recv(m, sock, ZMQ_DONTWAIT) >= 0)
            return 0;
        int e = z_errno();
        z_close(m);
        if (e != EINTR)
            return e;
    }
}

/* Take and drop the rest of a message whose part in m had `more` set, so that the
 * next read starts at a message's first part (its identity) whatever went wrong. */
static void drain_rest(void *sock, zmq_msg_t *m, int more) {
    while (more) {
        if (recv_part(sock, m))
            return;
        more = z_more(m);
        z_close(m);
    }
}

/* read(handle, n, max_bytes) -> (list of (identity, payload, extra_parts, fd), errno)
 *
 * Up to n ROUTER messages, stopping once max_bytes (of every part) are in hand.
 * payload is the first part after the identity; extra_parts counts the parts after
 * it, read and dropped (a peer of ours sends exactly one); fd is the connection the
 * payload came on (ZMQ_SRCFD), for closing it. errno is 0 after n messages or
 * max_bytes, EAGAIN when the queue ran dry, else the error that stopped it. A
 * message is always taken whole, even when making its objects fails (MemoryError,
 * raised after the message is drained: its parts must not be read as the next
 * message's identity). */
static PyObject *read_messages(PyObject *self, PyObject *args) {
    unsigned long long handle;
    Py_ssize_t n, max_bytes, size = 0;
    if (!PyArg_ParseTuple(args, "Knn", &handle, &n, &max_bytes))
        return NULL;
    if (!z_recv) {
        PyErr_SetString(PyExc_RuntimeError, "bind_zmq was not called");
        return NULL;
    }
    void *sock = (void *)(uintptr_t)handle;
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    int err = 0;
    zmq_msg_t m;
    for (Py_ssize_t i = 0; i < n && size < max_bytes; i++) {
        if ((err = recv_part(sock, &m)))
            break;
        int more = z_more(&m);
        size += (Py_ssize_t)z_size(&m);
        PyObject *ident = PyBytes_FromStringAndSize(z_data(&m), (Py_ssize_t)z_size(&m));
        z_close(&m);
        if (!ident) {
            drain_rest(sock, &m, more);
            goto fail;
        }
        PyObject *payload = NULL;
        int fd = -1;
        long extra = 0;
        if (!more) { /* not from a ROUTER peer: nothing after the identity */
            payload = PyBytes_FromStringAndSize(NULL, 0);
        } else if (!(err = recv_part(sock, &m))) {
            more = z_more(&m);
            fd = z_get(&m, ZMQ_SRCFD);
            size += (Py_ssize_t)z_size(&m);
            payload = PyBytes_FromStringAndSize(z_data(&m), (Py_ssize_t)z_size(&m));
            z_close(&m);
            while (more) {
                if ((err = recv_part(sock, &m)))
                    break; /* a message arrives whole: only a closed context gets here */
                more = z_more(&m);
                size += (Py_ssize_t)z_size(&m);
                z_close(&m);
                extra++;
            }
        } else { /* the same: only a closed context fails inside a message */
            Py_DECREF(ident);
            break;
        }
        if (!payload) {
            Py_DECREF(ident);
            goto fail;
        }
        PyObject *t = Py_BuildValue("(NNli)", ident, payload, extra, fd); /* N: released on failure too */
        if (!t || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            goto fail;
        }
        Py_DECREF(t);
        if (err)
            break;
    }
    return Py_BuildValue("(Ni)", out, err);
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"bind_zmq", bind_zmq, METH_VARARGS,
     "Hand over libzmq's zmq_msg_init, _recv, _close, _data, _size, _more, _get and zmq_errno by address."},
    {"read", read_messages, METH_VARARGS,
     "read(handle, n, max_bytes) -> (list of (identity, payload, extra_parts, fd), errno)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastrecv", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastrecv(void) { return PyModule_Create(&module); }
