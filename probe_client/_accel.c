/* probe_client._accel: the optional C record write of the probe's wrappers.
 *
 * One job: the part of an attached method's wrapper that runs after the
 * user's call (the SPAN record, its SPAN_EXT, the outermost span's
 * bookkeeping) in one C call instead of ~40 bytecodes, a lock round trip and
 * a struct.pack_into; and, the same way, the REQUEST records of a batch of
 * int ids (`probe.request_tokens`) and of one event (`probe.request`). It writes exactly the bytes the Python path writes
 * (wire.RECORD / wire.EXT_RECORD, little-endian; tests compare them) and
 * never does anything else: it never sends, never blocks, never allocates
 * a GC-tracked object, never calls back into Python code other than the
 * buffer lock's locked(), and never raises into the caller. Anything it is
 * not sure of (the lock is held, the buffer is full, a value out of range,
 * an unexpected type) it leaves to the Python path by returning 2, so there
 * is one definition of every corner case. The write takes no lock: it runs
 * under the GIL, calls nothing that can release it, and only when no thread
 * holds the buffer lock, so no critical section of the Python path can be
 * in progress. The client works without this module (stdlib only); builds
 * without the GIL (free-threaded) must not use it, and `_probe.py` checks.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <stdint.h>
#include <time.h>

#define RECORD_SIZE 32
#define REC_SPAN 1
#define REC_SPAN_EXT 4
#define EXT_HAS_WORK 1
#define EXT_HAS_IDLE 2
#define EXT_IDLE 4

/* rec()'s answers; the generated wrapper acts on them. */
#define WROTE 0
#define WROTE_FLUSH_DUE 1
#define USE_PYTHON 2

static PyObject *str_pos, *str_seqless, *str_last_send_ns, *str_st;
static PyObject *answer[3];

/* ----- ThreadState: the per-thread span state, read in C without lookups -- */

typedef struct {
    PyObject_HEAD
    unsigned int tid;
    int depth;
    unsigned int stage_id;
    unsigned int batch;
    int ext;
    PyObject *work; /* None or an int */
    PyObject *idle; /* None or a bool */
    unsigned long long last_end_ns; /* t1 of the last leave(): the Python path's */
} ThreadState;

static int
ts_init(ThreadState *self, PyObject *args, PyObject *kwds)
{
    unsigned int tid;
    static char *kwlist[] = {"tid", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "I", kwlist, &tid))
        return -1;
    self->tid = tid;
    self->depth = 0;
    self->stage_id = 0;
    self->batch = 0;
    self->ext = 0;
    self->last_end_ns = 0;
    Py_INCREF(Py_None);
    Py_XSETREF(self->work, Py_None);
    Py_INCREF(Py_None);
    Py_XSETREF(self->idle, Py_None);
    return 0;
}

static void
ts_dealloc(ThreadState *self)
{
    Py_XDECREF(self->work);
    Py_XDECREF(self->idle);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef ts_members[] = {
    {"tid", T_UINT, offsetof(ThreadState, tid), 0, "native thread id"},
    {"depth", T_INT, offsetof(ThreadState, depth), 0, "open spans on the thread"},
    {"stage_id", T_UINT, offsetof(ThreadState, stage_id), 0, "current stage's string id"},
    {"batch", T_UINT, offsetof(ThreadState, batch), 0, "current batch size (u32)"},
    {"ext", T_INT, offsetof(ThreadState, ext), 0, "1: work or idle is set"},
    {"work", T_OBJECT, offsetof(ThreadState, work), 0, "current work measure or None"},
    {"idle", T_OBJECT, offsetof(ThreadState, idle), 0, "current idle mark or None"},
    {"last_end_ns", T_ULONGLONG, offsetof(ThreadState, last_end_ns), 0,
     "end of the last span leave() timed (monotonic ns)"},
    {NULL}};

/* Not GC-tracked: it holds only None, ints and bools, which hold nothing. */
static PyTypeObject ThreadStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe_client._accel.ThreadState",
    .tp_basicsize = sizeof(ThreadState),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per-thread probe state; one per thread, made on the thread's first span.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ts_init,
    .tp_dealloc = (destructor)ts_dealloc,
    .tp_members = ts_members,
};

/* ----- Writer: one per attached wrapper --------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *state;  /* the probe's __dict__: _pos, _seqless, _last_send_ns */
    PyObject *buf;    /* the probe's bytearray */
    PyObject *locked; /* the buffer lock's bound locked() */
    PyObject *local;      /* the probe's threading.local: .st is the thread's state */
    PyObject *make_state; /* the probe's _thread_state(): makes and stores one */
    uint64_t cached_thread; /* PyThreadState id (never reused) of cached_st's thread */
    PyObject *cached_st;    /* that thread's ThreadState: enter()/leave() skip the lookup */
    unsigned int kind_id;
    Py_ssize_t full_at;
    Py_ssize_t half_at;
    long long interval_ns;
} Writer;

static int
writer_init(Writer *self, PyObject *args, PyObject *kwds)
{
    PyObject *state, *buf, *locked, *local, *make_state;
    unsigned int kind_id;
    Py_ssize_t full_at, half_at;
    long long interval_ns;
    static char *kwlist[] = {"state",   "buf",     "locked",      "local", "make_state",
                             "kind_id", "full_at", "half_at", "interval_ns", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OOOInnL", kwlist, &PyDict_Type, &state,
                                     &PyByteArray_Type, &buf, &locked, &local, &make_state,
                                     &kind_id, &full_at, &half_at, &interval_ns))
        return -1;
    if (kind_id > 0xFFFF || full_at < 0 || full_at + RECORD_SIZE > PyByteArray_GET_SIZE(buf)) {
        PyErr_SetString(PyExc_ValueError, "kind_id or buffer bounds out of range");
        return -1;
    }
    Py_INCREF(state);
    Py_XSETREF(self->state, state);
    Py_INCREF(buf);
    Py_XSETREF(self->buf, buf);
    Py_INCREF(locked);
    Py_XSETREF(self->locked, locked);
    Py_INCREF(local);
    Py_XSETREF(self->local, local);
    Py_INCREF(make_state);
    Py_XSETREF(self->make_state, make_state);
    Py_CLEAR(self->cached_st);
    self->cached_thread = 0;
    self->kind_id = kind_id;
    self->full_at = full_at;
    self->half_at = half_at;
    self->interval_ns = interval_ns;
    return 0;
}

static int
writer_traverse(Writer *self, visitproc visit, void *arg)
{
    Py_VISIT(self->state);
    Py_VISIT(self->buf);
    Py_VISIT(self->locked);
    Py_VISIT(self->local);
    Py_VISIT(self->make_state);
    Py_VISIT(self->cached_st);
    return 0;
}

static int
writer_clear(Writer *self)
{
    Py_CLEAR(self->state);
    Py_CLEAR(self->buf);
    Py_CLEAR(self->locked);
    Py_CLEAR(self->local);
    Py_CLEAR(self->make_state);
    Py_CLEAR(self->cached_st);
    return 0;
}

static void
writer_dealloc(Writer *self)
{
    PyObject_GC_UnTrack(self);
    writer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline void
put_u16(unsigned char *p, unsigned int v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static inline void
put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void
put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A dict value that must be an exact int; -1 with no error set when it is not. */
static inline int
dict_int(PyObject *dict, PyObject *key, long long *out)
{
    PyObject *v = PyDict_GetItemWithError(dict, key); /* borrowed */
    int overflow = 0;
    if (v == NULL || !PyLong_CheckExact(v)) {
        PyErr_Clear();
        return -1;
    }
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static inline int
dict_set_int(PyObject *dict, PyObject *key, long long value)
{
    PyObject *v = PyLong_FromLongLong(value); /* ints are never GC-tracked */
    int rc;
    if (v == NULL)
        return -1;
    rc = PyDict_SetItem(dict, key, v);
    Py_DECREF(v);
    return rc;
}

static inline int
as_u64(PyObject *v, uint64_t *out)
{
    if (!PyLong_CheckExact(v))
        return -1;
    *out = PyLong_AsUnsignedLongLong(v);
    if (*out == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static inline uint64_t
monotonic_ns(void)
{
    /* The clock of time.monotonic_ns() on Linux. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static PyObject *
answer_of(int code)
{
    PyErr_Clear();
    Py_INCREF(answer[code]);
    return answer[code];
}

/* The write of one span ending at t1; returns WROTE, WROTE_FLUSH_DUE or
 * USE_PYTHON (nothing written). Mirrors the wrapper template's write. */
static int
write_span(Writer *self, ThreadState *st, uint64_t t0, uint64_t t1)
{
    PyObject *held;
    long long pos, seqless = 0, last_send;
    int ext_flags = 0;
    long long work = 0;
    unsigned char *p;
    int flush_due = 0;

    if (self->state == NULL)
        return USE_PYTHON;
    if (st->depth < 0 || st->depth > 255)
        return USE_PYTHON; /* the Python path's struct.error, counted there */
    if (st->ext) {
        if (st->work != Py_None) {
            int overflow = 0;
            if (!PyLong_CheckExact(st->work))
                return USE_PYTHON;
            work = PyLong_AsLongLongAndOverflow(st->work, &overflow);
            if (overflow || (work == -1 && PyErr_Occurred()))
                return USE_PYTHON;
            ext_flags = EXT_HAS_WORK;
        }
        if (st->idle == Py_True)
            ext_flags |= EXT_HAS_IDLE | EXT_IDLE;
        else if (st->idle == Py_False)
            ext_flags |= EXT_HAS_IDLE;
        else if (st->idle != Py_None)
            return USE_PYTHON;
    }
    /* A thread inside a locked section (a send, a drain, the GC callback's
     * drain) may be between two of its writes: let the Python path wait. */
    held = PyObject_CallNoArgs(self->locked);
    if (held != Py_False) {
        Py_XDECREF(held);
        return USE_PYTHON;
    }
    Py_DECREF(held);
    if (dict_int(self->state, str_pos, &pos) < 0 || pos < 0 || pos >= self->full_at)
        return USE_PYTHON; /* full: the Python path sends first */
    if (st->ext && dict_int(self->state, str_seqless, &seqless) < 0)
        return USE_PYTHON;
    if (PyByteArray_GET_SIZE(self->buf) < pos + 2 * RECORD_SIZE)
        return USE_PYTHON;
    p = (unsigned char *)PyByteArray_AS_STRING(self->buf) + pos;
    /* wire.RECORD "<BBHIQQII" */
    p[0] = REC_SPAN;
    p[1] = (unsigned char)st->depth;
    put_u16(p + 2, self->kind_id);
    put_u32(p + 4, st->tid);
    put_u64(p + 8, t0);
    put_u64(p + 16, t1);
    put_u32(p + 24, st->stage_id);
    put_u32(p + 28, st->batch);
    pos += RECORD_SIZE;
    if (st->ext) {
        /* wire.EXT_RECORD "<BBHIqQII": type, flags, 0, 0, work, 0, 0, 0 */
        p += RECORD_SIZE;
        memset(p, 0, RECORD_SIZE);
        p[0] = REC_SPAN_EXT;
        p[1] = (unsigned char)ext_flags;
        put_u64(p + 8, (uint64_t)work);
        pos += RECORD_SIZE;
        if (dict_set_int(self->state, str_seqless, seqless + 1) < 0)
            return USE_PYTHON; /* only on memory exhaustion; nothing advanced */
    }
    if (dict_set_int(self->state, str_pos, pos) < 0) {
        if (st->ext)
            dict_set_int(self->state, str_seqless, seqless);
        return USE_PYTHON;
    }
    if (st->depth == 0) {
        st->stage_id = 0;
        st->batch = 0;
        if (st->ext) {
            st->ext = 0;
            Py_INCREF(Py_None);
            Py_SETREF(st->work, Py_None);
            Py_INCREF(Py_None);
            Py_SETREF(st->idle, Py_None);
        }
        if (dict_int(self->state, str_last_send_ns, &last_send) < 0 ||
            (long long)t1 - last_send >= self->interval_ns || pos >= self->half_at)
            flush_due = 1;
    }
    return flush_due;
}

/* rec(st, t0, t1) -> 0 written, 1 written and a flush is due, 2 nothing
 * written: take the Python path. For wrappers with tags: the wrapper has
 * read t1 and lowered the depth before evaluating them. */
static PyObject *
writer_rec(Writer *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t t0, t1;
    if (nargs != 3 || Py_TYPE(args[0]) != &ThreadStateType || as_u64(args[1], &t0) < 0 ||
        as_u64(args[2], &t1) < 0)
        return answer_of(USE_PYTHON);
    return answer_of(write_span(self, (ThreadState *)args[0], t0, t1));
}

/* The calling thread's ThreadState (borrowed from the cache), or NULL with
 * no error set when it cannot be had without raising. The first span of a
 * thread makes it through the probe's _thread_state(), so Python's
 * `probe._local.st` and this are the same object. */
static ThreadState *
current_state(Writer *self)
{
    uint64_t thread = PyThreadState_GetID(PyThreadState_Get());
    PyObject *st;
    if (self->cached_st != NULL && self->cached_thread == thread)
        return (ThreadState *)self->cached_st;
    if (self->local == NULL)
        return NULL;
    st = PyObject_GetAttr(self->local, str_st);
    if (st == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            return NULL;
        }
        PyErr_Clear();
        st = PyObject_CallNoArgs(self->make_state);
        if (st == NULL) {
            PyErr_Clear();
            return NULL;
        }
    }
    if (Py_TYPE(st) != &ThreadStateType) {
        Py_DECREF(st);
        return NULL;
    }
    Py_XSETREF(self->cached_st, st);
    self->cached_thread = thread;
    return (ThreadState *)st;
}

/* enter() -> t0: the thread's depth goes up by one, then the clock is read. */
static PyObject *
writer_enter(Writer *self, PyObject *Py_UNUSED(ignored))
{
    ThreadState *st = current_state(self);
    if (st != NULL)
        st->depth += 1;
    return PyLong_FromUnsignedLongLong(monotonic_ns());
}

/* leave(t0) -> as rec(): the clock is read (st.last_end_ns), the depth
 * lowered, and the span written. For wrappers without tags. */
static PyObject *
writer_leave(Writer *self, PyObject *t0_obj)
{
    uint64_t t0, t1 = monotonic_ns();
    ThreadState *st = current_state(self);
    if (st == NULL)
        return answer_of(USE_PYTHON);
    st->last_end_ns = t1;
    st->depth -= 1;
    if (as_u64(t0_obj, &t0) < 0)
        return answer_of(USE_PYTHON);
    return answer_of(write_span(self, st, t0, t1));
}

static PyMethodDef writer_methods[] = {
    {"rec", (PyCFunction)(void (*)(void))writer_rec, METH_FASTCALL,
     "rec(st, t0, t1): 0 written, 1 written and a flush is due, 2 take the Python path."},
    {"enter", (PyCFunction)writer_enter, METH_NOARGS,
     "enter() -> t0: the thread's depth + 1, then the clock."},
    {"leave", (PyCFunction)writer_leave, METH_O,
     "leave(t0): the clock (the thread's st.last_end_ns), depth - 1, then as rec()."},
    {NULL}};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "probe_client._accel.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The record write of one attached wrapper (its kind id, its probe's buffer).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)writer_init,
    .tp_traverse = (traverseproc)writer_traverse,
    .tp_clear = (inquiry)writer_clear,
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_methods = writer_methods,
};

/* ----- request_key: BLAKE2b with an 8-byte digest (RFC 7693) ------------ */

/* wire.request_key() of a str id's UTF-8 bytes, here for ids that are
 * ASCII (their UTF-8 is their characters, read from the str in place): one
 * unkeyed BLAKE2b-64, the digest read little-endian, i.e. the first state
 * word. ~0.1 us for a 36-character id, against ~0.5 us through hashlib
 * with the encode. Tested against hashlib on every length 0-300. */
static const uint64_t blake2b_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

static const uint8_t blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

static inline uint64_t
rotr64(uint64_t x, int n)
{
    return (x >> n) | (x << (64 - n));
}

static inline uint64_t
get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#define B2B_G(a, b, c, d, x, y)                                                                    \
    do {                                                                                           \
        v[a] = v[a] + v[b] + (x);                                                                  \
        v[d] = rotr64(v[d] ^ v[a], 32);                                                            \
        v[c] = v[c] + v[d];                                                                        \
        v[b] = rotr64(v[b] ^ v[c], 24);                                                            \
        v[a] = v[a] + v[b] + (y);                                                                  \
        v[d] = rotr64(v[d] ^ v[a], 16);                                                            \
        v[c] = v[c] + v[d];                                                                        \
        v[b] = rotr64(v[b] ^ v[c], 63);                                                            \
    } while (0)

/* One compression of a 128-byte block; t: bytes hashed so far, last: the final block. */
static void
blake2b_compress(uint64_t h[8], const unsigned char block[128], uint64_t t, int last)
{
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = blake2b_iv[i];
    }
    v[12] ^= t; /* the counter's high word stays 0: ids are far below 2^64 bytes */
    if (last)
        v[14] = ~v[14];
    for (int i = 0; i < 16; i++)
        m[i] = get_u64(block + 8 * i);
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = blake2b_sigma[r];
        B2B_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        B2B_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        B2B_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        B2B_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        B2B_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        B2B_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        B2B_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        B2B_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

static uint64_t
blake2b_64(const unsigned char *data, Py_ssize_t len)
{
    uint64_t h[8];
    unsigned char block[128];
    uint64_t t = 0;
    for (int i = 0; i < 8; i++)
        h[i] = blake2b_iv[i];
    h[0] ^= 0x01010000ULL ^ 8; /* depth 1, fanout 1, no key, 8-byte digest */
    while (len > 128) {
        t += 128;
        blake2b_compress(h, data, t, 0);
        data += 128;
        len -= 128;
    }
    memset(block, 0, sizeof block);
    memcpy(block, data, (size_t)len);
    t += (uint64_t)len;
    blake2b_compress(h, block, t, 1);
    return h[0]; /* the digest's first 8 bytes, read little-endian */
}

/* A request id as the record's u64 and its flags: an exact int masked to
 * 64 bits, or an exact str of ASCII characters hashed (REQ_STR_ID). -1 for
 * anything else (a str subclass, a non-ASCII str, another type): the
 * Python path takes it. */
static int
request_id_of(PyObject *id, uint64_t *rid, int *str_id)
{
    if (PyLong_CheckExact(id)) {
        *rid = PyLong_AsUnsignedLongLongMask(id);
        if (*rid == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        *str_id = 0;
        return 0;
    }
    if (PyUnicode_CheckExact(id) && PyUnicode_IS_READY(id) && PyUnicode_IS_ASCII(id)) {
        *rid = blake2b_64((const unsigned char *)PyUnicode_DATA(id), PyUnicode_GET_LENGTH(id));
        *str_id = 1;
        return 0;
    }
    return -1;
}

/* ----- request_tokens: a batch of token events (probe_client/_requests.py) -- */

#define REC_REQUEST 7
#define REQ_EVENT_TOKEN 3
#define REQ_EVENT_ARRIVED 1
#define REQ_HAS_TOKENS 1
#define REQ_STR_ID 2

/* request_tokens(state, buf, locked, full_at, ts, tid, ids, count) -> n:
 * the REQUEST records (event token, `count` tokens, flags REQ_HAS_TOKENS)
 * of ids[0..n) written at the probe's _pos, and _pos advanced past them,
 * exactly as the Python loop writes them. It stops, leaving the rest to the
 * Python path, at the first id that is neither an exact int nor an exact
 * ASCII str (request_id_of), at a buffer position >= full_at (a send is
 * due), or at once (n = 0) when the buffer lock is held or an argument is
 * not what it expects. An int id is masked to 64 bits, as the Python
 * path's `& U64_MAX` does; a str id is hashed here, as request_key(). */
static PyObject *
accel_request_tokens(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *state, *buf, *held, *ids;
    Py_ssize_t full_at, n_ids, i;
    long long pos, count;
    unsigned long long ts;
    unsigned long tid;
    int overflow = 0;
    unsigned char *base;
    if (nargs != 8 || !PyDict_CheckExact(args[0]) || !PyByteArray_CheckExact(args[1]) ||
        !PyLong_CheckExact(args[3]) || !PyLong_CheckExact(args[4]) ||
        !PyLong_CheckExact(args[5]) || !PyLong_CheckExact(args[7]))
        return Py_NewRef(answer[0]);
    ids = args[6];
    if (!PyList_CheckExact(ids) && !PyTuple_CheckExact(ids))
        return Py_NewRef(answer[0]);
    state = args[0];
    buf = args[1];
    full_at = PyLong_AsSsize_t(args[3]);
    ts = PyLong_AsUnsignedLongLong(args[4]);
    tid = PyLong_AsUnsignedLong(args[5]);
    count = PyLong_AsLongLongAndOverflow(args[7], &overflow);
    if (PyErr_Occurred() || overflow || count < 0 || count > 0x7FFFFFFFLL || tid > 0xFFFFFFFFUL ||
        full_at < 0 || full_at + RECORD_SIZE > PyByteArray_GET_SIZE(buf)) {
        PyErr_Clear();
        return Py_NewRef(answer[0]);
    }
    held = PyObject_CallNoArgs(args[2]);
    if (held != Py_False) {
        if (held == NULL)
            PyErr_Clear();
        Py_XDECREF(held);
        return Py_NewRef(answer[0]);
    }
    Py_DECREF(held);
    if (dict_int(state, str_pos, &pos) < 0 || pos < 0)
        return Py_NewRef(answer[0]);
    base = (unsigned char *)PyByteArray_AS_STRING(buf);
    n_ids = PySequence_Fast_GET_SIZE(ids);
    for (i = 0; i < n_ids && pos < full_at; i++) {
        uint64_t rid;
        int str_id;
        unsigned char *p;
        if (request_id_of(PySequence_Fast_GET_ITEM(ids, i), &rid, &str_id) < 0)
            break;
        p = base + pos;
        p[0] = REC_REQUEST;
        p[1] = REQ_EVENT_TOKEN;
        put_u16(p + 2, REQ_HAS_TOKENS | (str_id ? REQ_STR_ID : 0));
        put_u32(p + 4, (uint32_t)tid);
        put_u64(p + 8, ts);
        put_u64(p + 16, rid);
        put_u32(p + 24, (uint32_t)count);
        put_u32(p + 28, 0);
        pos += RECORD_SIZE;
    }
    if (i && dict_set_int(state, str_pos, pos) < 0) {
        PyErr_Clear();
        return Py_NewRef(answer[0]); /* _pos unchanged: the records are not there */
    }
    return PyLong_FromSsize_t(i); /* ints are never GC-tracked */
}

/* request_one(state, buf, locked, full_at, ts, tid, code, flags, id, n) -> bool:
 * one REQUEST record (`probe.request` of an event that sends no text) written
 * at the probe's _pos and _pos advanced, byte for byte what the Python path
 * packs; `id` as request_id_of() takes it (a str id adds REQ_STR_ID to
 * `flags`). False, with nothing written, when the buffer lock is held, the
 * position is >= full_at (a send is due), the id is one request_id_of()
 * leaves to Python, a str id arrives (its text goes with it: Python) or an
 * argument is not an int in its field's range: the Python path then
 * writes it. */
static PyObject *
accel_request_one(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *held;
    Py_ssize_t full_at;
    long long pos, code, flags, n;
    unsigned long long ts;
    uint64_t rid;
    unsigned long tid;
    int overflow = 0, str_id = 0;
    unsigned char *p;
    if (nargs != 10 || !PyDict_CheckExact(args[0]) || !PyByteArray_CheckExact(args[1]))
        return Py_NewRef(Py_False);
    for (Py_ssize_t i = 3; i < 10; i++)
        if (i != 8 && !PyLong_CheckExact(args[i]))
            return Py_NewRef(Py_False);
    full_at = PyLong_AsSsize_t(args[3]);
    ts = PyLong_AsUnsignedLongLong(args[4]);
    tid = PyLong_AsUnsignedLong(args[5]);
    code = PyLong_AsLongLongAndOverflow(args[6], &overflow);
    flags = overflow ? -1 : PyLong_AsLongLongAndOverflow(args[7], &overflow);
    n = overflow ? -1 : PyLong_AsLongLongAndOverflow(args[9], &overflow);
    if (PyErr_Occurred() || overflow || code < 1 || code > 255 || flags < 0 || flags > 0xFFFF ||
        n < 0 || n > 0x7FFFFFFFLL || tid > 0xFFFFFFFFUL || full_at < 0 ||
        full_at + RECORD_SIZE > PyByteArray_GET_SIZE(args[1])) {
        PyErr_Clear();
        return Py_NewRef(Py_False);
    }
    if ((code == REQ_EVENT_ARRIVED && PyUnicode_Check(args[8])) ||
        request_id_of(args[8], &rid, &str_id) < 0)
        return Py_NewRef(Py_False); /* a str id's arrival sends its text: Python */
    if (str_id)
        flags |= REQ_STR_ID;
    held = PyObject_CallNoArgs(args[2]);
    if (held != Py_False) {
        if (held == NULL)
            PyErr_Clear();
        Py_XDECREF(held);
        return Py_NewRef(Py_False);
    }
    Py_DECREF(held);
    if (dict_int(args[0], str_pos, &pos) < 0 || pos < 0 || pos >= full_at)
        return Py_NewRef(Py_False);
    p = (unsigned char *)PyByteArray_AS_STRING(args[1]) + pos;
    p[0] = REC_REQUEST;
    p[1] = (unsigned char)code;
    put_u16(p + 2, (unsigned int)flags);
    put_u32(p + 4, (uint32_t)tid);
    put_u64(p + 8, ts);
    put_u64(p + 16, rid);
    put_u32(p + 24, (uint32_t)n);
    put_u32(p + 28, 0);
    if (dict_set_int(args[0], str_pos, pos + RECORD_SIZE) < 0) {
        PyErr_Clear();
        return Py_NewRef(Py_False); /* _pos unchanged: the record is not there */
    }
    return Py_NewRef(Py_True);
}

/* request_key(s) -> int: wire.request_key() of an ASCII str (tests compare
 * the two); None for anything request_id_of() would leave to Python. */
static PyObject *
accel_request_key(PyObject *mod, PyObject *arg)
{
    uint64_t rid;
    int str_id;
    if (!PyUnicode_Check(arg) || request_id_of(arg, &rid, &str_id) < 0 || !str_id)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(rid);
}

static PyMethodDef accel_functions[] = {
    {"request_tokens", (PyCFunction)(void (*)(void))accel_request_tokens, METH_FASTCALL,
     "request_tokens(state, buf, locked, full_at, ts, tid, ids, count) -> records written."},
    {"request_one", (PyCFunction)(void (*)(void))accel_request_one, METH_FASTCALL,
     "request_one(state, buf, locked, full_at, ts, tid, code, flags, id, n) -> written."},
    {"request_key", (PyCFunction)accel_request_key, METH_O,
     "request_key(s) -> the 64-bit key of an ASCII str id (BLAKE2b-64), else None."},
    {NULL}};

static struct PyModuleDef accel_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "probe_client._accel",
    .m_doc = "The optional C record write of the probe's wrappers (see _accel.c).",
    .m_size = -1,
    .m_methods = accel_functions,
};

PyMODINIT_FUNC
PyInit__accel(void)
{
    PyObject *m;
    if (PyType_Ready(&ThreadStateType) < 0 || PyType_Ready(&WriterType) < 0)
        return NULL;
    str_pos = PyUnicode_InternFromString("_pos");
    str_seqless = PyUnicode_InternFromString("_seqless");
    str_last_send_ns = PyUnicode_InternFromString("_last_send_ns");
    str_st = PyUnicode_InternFromString("st");
    if (!str_pos || !str_seqless || !str_last_send_ns || !str_st)
        return NULL;
    for (int i = 0; i < 3; i++) {
        answer[i] = PyLong_FromLong(i); /* small ints: cached, immortal enough */
        if (answer[i] == NULL)
            return NULL;
    }
    m = PyModule_Create(&accel_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ThreadStateType);
    if (PyModule_AddObject(m, "ThreadState", (PyObject *)&ThreadStateType) < 0)
        goto fail;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(m, "Writer", (PyObject *)&WriterType) < 0)
        goto fail;
    if (PyModule_AddIntConstant(m, "RECORD_SIZE", RECORD_SIZE) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
