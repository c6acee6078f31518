/* sitsd._native: the two things the loop needs done without the GIL.
 *
 * Ticker: the wasmtime epoch ticker as a native thread.
 * Every module call runs under an epoch deadline, so something must advance the engine's epoch on the wall
 * clock, also while a module runs. A Python thread doing that takes the GIL 2000 times a second (0.5 ms tick),
 * and each time it wakes while the loop thread holds the GIL it asks for it; the loop thread in turn waits
 * for it after every call that released it. This thread never touches the interpreter: it sleeps on an
 * absolute CLOCK_MONOTONIC schedule and calls wasmtime_engine_increment_epoch (thread-safe: an atomic add on
 * the engine). That lets the loop keep the GIL through a module call (sitsd/wasm/module.py calls the C API
 * through ctypes.PyDLL) while the epoch deadline still interrupts a runaway module.
 *
 * The function and the engine are passed as addresses (from wasmtime-py's ctypes bindings), so this file
 * links against nothing but libc. The Ticker also takes the Python Engine object (`owner`) and holds a strong
 * reference to it until its thread is joined (close() or dealloc), so the engine cannot be freed under the
 * thread. The type is deliberately not GC-tracked: the cycle collector would otherwise see the engine as
 * reachable only through the ticker and could run wasmtime's Engine.__del__ (which frees the native engine)
 * before the ticker's dealloc joins the thread, which is what happened at interpreter exit after an uncaught
 * exception (SIGSEGV on the next tick) when the ticker held only the raw pointer.
 *
 * Schedule: absolute wake-ups, but the next one is computed from max(scheduled, now) after each tick, so two
 * increments are always at least one period apart (a late wake-up delays the following ticks instead of
 * being caught up). An epoch deadline of n ticks therefore never fires before (n - 1) periods have passed.
 *
 * sleep_until(t_ns): sleeps until CLOCK_MONOTONIC (time.perf_counter_ns on Linux) reaches t_ns with the GIL
 * released, and returns when the kernel woke the thread (read before the GIL is taken back). The caller
 * reads the clock again once it holds the GIL: the two differences tell a late wake-up by the kernel (or the
 * hypervisor under it) from a wait for the GIL. bench/hotswap.py times its loop this way.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

typedef void (*increment_fn)(void *engine);

typedef struct {
    PyObject_HEAD
    pthread_t thread;
    int started;
    int stop;                 /* atomic */
    unsigned long long ticks; /* atomic: increments done */
    unsigned long long resyncs; /* atomic: times the thread woke more than one period late */
    long long min_gap_ns;     /* atomic: the shortest time between two wake-ups that ticked (-1: fewer than two) */
    increment_fn fn;
    void *engine;
    PyObject *owner;          /* the Python Engine: a strong reference, dropped after the join */
    long period_ns;
} Ticker;

static void add_ns(struct timespec *t, long ns) {
    t->tv_nsec += ns;
    while (t->tv_nsec >= 1000000000L) {
        t->tv_nsec -= 1000000000L;
        t->tv_sec += 1;
    }
}

static long long diff_ns(const struct timespec *a, const struct timespec *b) {
    return (long long)(a->tv_sec - b->tv_sec) * 1000000000LL + (a->tv_nsec - b->tv_nsec);
}

static long long ts_ns(const struct timespec *t) {
    return (long long)t->tv_sec * 1000000000LL + t->tv_nsec;
}

/* The next wake-up after a tick done by `now_ns` that was scheduled for `scheduled_ns`: one period after the
   later of the two, so the next tick is never less than a period after this one, however late this one was. */
static long long next_wake_ns(long long scheduled_ns, long long now_ns, long long period_ns) {
    return (now_ns > scheduled_ns ? now_ns : scheduled_ns) + period_ns;
}

static void *ticker_main(void *arg) {
    Ticker *t = (Ticker *)arg;
    struct timespec next, now, woke;
    long long last_woke = -1;
    /* a 1 us timer slack keeps the tick close to its period (field notes: the default 50 us slack and the
       scheduler made a 0.5 ms Python ticker overshoot by up to 418 us at p99) */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    clock_gettime(CLOCK_MONOTONIC, &next);
    add_ns(&next, t->period_ns);
    while (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
        int rc;
        do {
            rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        } while (rc == EINTR);
        if (__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE))
            break;
        clock_gettime(CLOCK_MONOTONIC, &woke);
        t->fn(t->engine);
        __atomic_add_fetch(&t->ticks, 1ULL, __ATOMIC_RELAXED);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (last_woke >= 0) {
            long long gap = ts_ns(&woke) - last_woke, min = __atomic_load_n(&t->min_gap_ns, __ATOMIC_RELAXED);
            if (min < 0 || gap < min)
                __atomic_store_n(&t->min_gap_ns, gap, __ATOMIC_RELAXED);
        }
        last_woke = ts_ns(&woke);
        /* woken more than a period late (a stopped VM, a suspended box): counted */
        if (diff_ns(&now, &next) > t->period_ns)
            __atomic_add_fetch(&t->resyncs, 1ULL, __ATOMIC_RELAXED);
        /* never catch up: the next tick is a full period after this one (read after the increment), so a
           deadline never fires early, only late by the wake-up latencies */
        long long n = next_wake_ns(ts_ns(&next), ts_ns(&now), t->period_ns);
        next.tv_sec = (time_t)(n / 1000000000LL);
        next.tv_nsec = (long)(n % 1000000000LL);
    }
    return NULL;
}

/* Stops and joins the thread, then drops the engine reference (never before the join). */
static void ticker_join(Ticker *t) {
    if (t->started) {
        __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
        Py_BEGIN_ALLOW_THREADS
        pthread_join(t->thread, NULL);
        Py_END_ALLOW_THREADS
        t->started = 0;
    }
    Py_CLEAR(t->owner);
}

static int Ticker_init(Ticker *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"increment", "engine", "period_ns", "owner", NULL};
    unsigned long long fn_addr, engine_addr;
    long period_ns;
    PyObject *owner;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KKlO", kwlist, &fn_addr, &engine_addr, &period_ns, &owner))
        return -1;
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "ticker already started");
        return -1;
    }
    if (!fn_addr || !engine_addr) {
        PyErr_SetString(PyExc_ValueError, "increment and engine must be non-null addresses");
        return -1;
    }
    if (period_ns < 10000L || period_ns > 1000000000L) {
        PyErr_Format(PyExc_ValueError, "period_ns must be 10000..1000000000 (10 us to 1 s), got %ld", period_ns);
        return -1;
    }
    self->fn = (increment_fn)(uintptr_t)fn_addr;
    self->engine = (void *)(uintptr_t)engine_addr;
    self->period_ns = period_ns;
    self->stop = 0;
    self->ticks = 0;
    self->resyncs = 0;
    self->min_gap_ns = -1;
    Py_INCREF(owner);
    Py_XSETREF(self->owner, owner); /* held before the thread starts, dropped after it is joined */
    /* the thread takes no signals: CPython handles them on its main thread */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&self->thread, NULL, ticker_main, self);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        Py_CLEAR(self->owner);
        PyErr_Format(PyExc_OSError, "cannot start the epoch ticker thread: %s", strerror(rc));
        return -1;
    }
    pthread_setname_np(self->thread, "sitsd-wasm-epoch");
    self->started = 1;
    return 0;
}

static void Ticker_dealloc(Ticker *self) {
    ticker_join(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Ticker_close(Ticker *self, PyObject *Py_UNUSED(ignored)) {
    ticker_join(self);
    Py_RETURN_NONE;
}

static PyObject *Ticker_get_ticks(Ticker *self, void *closure) {
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&self->ticks, __ATOMIC_RELAXED));
}

static PyObject *Ticker_get_resyncs(Ticker *self, void *closure) {
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&self->resyncs, __ATOMIC_RELAXED));
}

static PyObject *Ticker_get_running(Ticker *self, void *closure) {
    return PyBool_FromLong(self->started);
}

static PyObject *Ticker_get_min_gap_ns(Ticker *self, void *closure) {
    long long v = __atomic_load_n(&self->min_gap_ns, __ATOMIC_RELAXED);
    if (v < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

static PyObject *Ticker_get_owner(Ticker *self, void *closure) {
    if (self->owner == NULL)
        Py_RETURN_NONE;
    return Py_NewRef(self->owner);
}

static PyMethodDef Ticker_methods[] = {
    {"close", (PyCFunction)Ticker_close, METH_NOARGS, "Stop the thread and wait for it (at most one period)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Ticker_getset[] = {
    {"ticks", (getter)Ticker_get_ticks, NULL, "epoch increments done so far", NULL},
    {"resyncs", (getter)Ticker_get_resyncs, NULL, "wake-ups more than one period late", NULL},
    {"running", (getter)Ticker_get_running, NULL, "whether the thread runs", NULL},
    {"min_gap_ns", (getter)Ticker_get_min_gap_ns, NULL,
     "the shortest time between two ticking wake-ups so far, ns (None before the second tick)", NULL},
    {"owner", (getter)Ticker_get_owner, NULL, "the engine object held until the thread is joined (None after)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TickerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sitsd._native.Ticker",
    .tp_doc = PyDoc_STR("Ticker(increment, engine, period_ns, owner): calls increment(engine) every period_ns "
                        "(at least) on a native thread that never takes the GIL; holds `owner` (the Python Engine "
                        "object behind the `engine` address) until the thread is joined."),
    .tp_basicsize = sizeof(Ticker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ticker_init,
    .tp_dealloc = (destructor)Ticker_dealloc,
    .tp_methods = Ticker_methods,
    .tp_getset = Ticker_getset,
};

static PyObject *sleep_until(PyObject *module, PyObject *arg) {
    long long t = PyLong_AsLongLong(arg);
    if (t == -1 && PyErr_Occurred())
        return NULL;
    if (t < 0) {
        PyErr_SetString(PyExc_ValueError, "sleep_until: t_ns must be a CLOCK_MONOTONIC time in ns (>= 0)");
        return NULL;
    }
    struct timespec target = {(time_t)(t / 1000000000LL), (long)(t % 1000000000LL)}, woke;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    do {
        rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &target, NULL);
    } while (rc == EINTR);
    clock_gettime(CLOCK_MONOTONIC, &woke);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLongLong((long long)woke.tv_sec * 1000000000LL + woke.tv_nsec);
}

static PyObject *next_wake(PyObject *Py_UNUSED(module), PyObject *args) {
    long long scheduled, now, period;
    if (!PyArg_ParseTuple(args, "LLL", &scheduled, &now, &period))
        return NULL;
    return PyLong_FromLongLong(next_wake_ns(scheduled, now, period));
}

static PyMethodDef native_functions[] = {
    {"next_wake", next_wake, METH_VARARGS,
     PyDoc_STR("next_wake(scheduled_ns, now_ns, period_ns) -> ns: the ticker's next wake-up after a tick scheduled "
               "for scheduled_ns and done by now_ns (the schedule the thread follows, for tests).")},
    {"sleep_until", sleep_until, METH_O,
     PyDoc_STR("sleep_until(t_ns) -> woke_ns: sleep until CLOCK_MONOTONIC reaches t_ns, GIL released; returns "
               "the time the kernel woke the thread, read before the GIL is taken back.")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "sitsd._native",
    .m_doc = "The wasmtime epoch ticker as a native thread, and a sleep that tells kernel lateness from GIL waits.",
    .m_size = -1,
    .m_methods = native_functions,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&TickerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TickerType);
    if (PyModule_AddObject(m, "Ticker", (PyObject *)&TickerType) < 0) {
        Py_DECREF(&TickerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
