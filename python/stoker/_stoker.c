/*
 * _stoker: the CPython binding of libstoker, under the pure-Python package `stoker`.
 *
 * Two types: Client (a stk_client) and File (a stk_file). Every call that may wait
 * on the network releases the GIL, so Python threads (and a DataLoader's pin-memory
 * thread) run while bytes move. Reads land straight in the caller's memory: read()
 * fills a bytes object allocated at its final size, readinto() and read_batch(bufs=)
 * fill any writable buffer (bytearray, memoryview, a numpy array) in place.
 *
 * Object lifetimes across the released GIL: a File counts the calls in progress on
 * it (busy); close() while another thread reads marks it closed and the last call
 * out closes the handle. A File holds a reference to its Client, and the Client
 * counts its open Files, so the stk_client is disconnected only after the last
 * File is closed and the Client is closed or collected. These counters change only
 * with the GIL held.
 *
 * fork(): a Client remembers the pid that made it. The first call in a child (a
 * DataLoader worker) calls stk_after_fork, which drops the parent's connections
 * and re-creates the locks, and forgets the parent's batches (their engine threads
 * do not exist in the child; their memory is left alone). Files opened before the
 * fork may be used in the child but are better reopened there.
 *
 * read_batch(): opens the named paths on a few short-lived threads at once (an open
 * is one metadata round trip per path component), then submits every read to a
 * stk_batch in one call and reaps them all. Batches are pooled per Client so that
 * concurrent read_batch calls from several threads do not share completions.
 *
 * Errors: libstoker's -errno becomes OSError(errno, strerror, filename), which
 * Python turns into FileNotFoundError, PermissionError, IsADirectoryError, ... by
 * errno. Use of a closed File or Client raises stoker.ClosedError, a subclass of
 * both OSError (errno EBADF) and ValueError (what the io module raises).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoker/stoker.h"

#define BATCH_POOL 8
#define OPEN_THREADS 8
#define READ_ALL_STEP (16u << 20)

static PyObject *ClosedError;

/* ---- errors ---- */

/* Raises OSError for -errno rc (the errno picks the subclass). Returns NULL. */
static PyObject *raise_rc(int rc, PyObject *filename)
{
	PyObject *args, *exc;

	if (rc == -ENOMEM)
		return PyErr_NoMemory();
	if (filename)
		args = Py_BuildValue("(isO)", -rc, stk_strerror(rc), filename);
	else
		args = Py_BuildValue("(is)", -rc, stk_strerror(rc));
	if (!args)
		return NULL;
	exc = PyObject_Call(PyExc_OSError, args, NULL);
	Py_DECREF(args);
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

static PyObject *raise_closed(const char *what)
{
	PyObject *exc = PyObject_CallFunction(ClosedError, "is", EBADF, what);

	if (exc) {
		PyErr_SetObject(ClosedError, exc);
		Py_DECREF(exc);
	}
	return NULL;
}

/* ---- Client ---- */

typedef struct {
	PyObject_HEAD stk_client *c;
	pid_t pid;	 /* the process c's connections belong to */
	int closed;	 /* close() called */
	unsigned busy;	 /* calls in progress without the GIL */
	unsigned nfiles; /* open File objects */
	unsigned max_inflight, batch_threads;
	pthread_mutex_t pool_lock; /* protects batches, nbatches */
	stk_batch *batches[BATCH_POOL];
	unsigned nbatches;
} ClientObject;

static PyTypeObject ClientType;

static void client_after_fork(ClientObject *self)
{
	/* The parent's batches belong to threads that do not exist here: forget them. */
	stk_after_fork(self->c);
	pthread_mutex_init(&self->pool_lock, NULL);
	self->nbatches = 0;
	self->busy = 0;
	self->pid = getpid();
}

/* Frees the stk_client once nothing uses it. Called with the GIL held. */
static void client_maybe_disconnect(ClientObject *self)
{
	stk_client *c = self->c;

	if (!c || !self->closed || self->busy || self->nfiles)
		return;
	self->c = NULL;
	if (self->pid != getpid())
		client_after_fork(self);
	for (unsigned i = 0; i < self->nbatches; i++)
		stk_batch_destroy(self->batches[i]);
	self->nbatches = 0;
	Py_BEGIN_ALLOW_THREADS stk_disconnect(c);
	Py_END_ALLOW_THREADS pthread_mutex_destroy(&self->pool_lock);
}

/*
 * Enters a call: checks the client is open (or, for calls on its open Files,
 * still connected) and is this process's. 0 or -1 (raised).
 */
static int client_enter_ex(ClientObject *self, int for_file)
{
	if (!self->c || (self->closed && !for_file)) {
		raise_closed("the client is closed");
		return -1;
	}
	if (self->pid != getpid())
		client_after_fork(self);
	self->busy++;
	return 0;
}

static int client_enter(ClientObject *self)
{
	return client_enter_ex(self, 0);
}

static void client_leave(ClientObject *self)
{
	self->busy--;
	client_maybe_disconnect(self);
}

static int client_init(ClientObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"cluster",	  "conns_per_node", "max_inflight",
				 "batch_threads", "write_buffer",   "stripe",
				 "chunk_size",	  "qos_class",	    NULL};
	const char *cluster = NULL, *qos_class = NULL;
	unsigned conns = 0, inflight = 64, threads = 2, stripe = 0, chunk = 0;
	unsigned long long wbuf = 0;
	struct stk_client_opts o;
	stk_client *c = NULL;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|zIIIKIIz", kwlist, &cluster, &conns, &inflight,
					 &threads, &wbuf, &stripe, &chunk, &qos_class))
		return -1;
	if (self->c) {
		PyErr_SetString(PyExc_RuntimeError, "Client already initialised");
		return -1;
	}
	memset(&o, 0, sizeof(o));
	o.size = sizeof(o);
	o.conns_per_node = conns; /* 0: the library's default */
	o.write_buffer = (size_t)wbuf;
	o.stripe = stripe;
	o.chunk_size = chunk;
	o.qos_class = qos_class;
	Py_BEGIN_ALLOW_THREADS rc = stk_connect(cluster, &o, &c);
	Py_END_ALLOW_THREADS if (rc)
	{
		PyObject *name = cluster ? PyUnicode_FromString(cluster) : NULL;
		raise_rc(rc, name);
		Py_XDECREF(name);
		return -1;
	}
	self->c = c;
	self->pid = getpid();
	self->closed = 0;
	self->max_inflight = inflight;
	self->batch_threads = threads;
	pthread_mutex_init(&self->pool_lock, NULL);
	return 0;
}

static void client_dealloc(ClientObject *self)
{
	self->closed = 1;
	self->busy = 0;
	client_maybe_disconnect(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *client_close(ClientObject *self, PyObject *unused)
{
	self->closed = 1;
	client_maybe_disconnect(self);
	Py_RETURN_NONE;
}

static PyObject *client_get_closed(ClientObject *self, void *unused)
{
	return PyBool_FromLong(!self->c || self->closed);
}

static PyObject *client_get_address(ClientObject *self, void *unused)
{
	if (!self->c)
		return raise_closed("the client is closed");
	return PyUnicode_FromString(stk_cluster_addr(self->c));
}

/* A batch for one call: from the pool, or new. NULL with -errno in *rc. GIL released. */
static stk_batch *batch_get(ClientObject *self, int *rc)
{
	struct stk_batch_opts o = {
	    .size = sizeof(o), .max_inflight = self->max_inflight, .threads = self->batch_threads};
	stk_batch *b = NULL;

	pthread_mutex_lock(&self->pool_lock);
	if (self->nbatches)
		b = self->batches[--self->nbatches];
	pthread_mutex_unlock(&self->pool_lock);
	if (b)
		return b;
	*rc = stk_batch_create(self->c, &o, &b);
	return *rc ? NULL : b;
}

static void batch_put(ClientObject *self, stk_batch *b)
{
	pthread_mutex_lock(&self->pool_lock);
	if (self->nbatches < BATCH_POOL) {
		self->batches[self->nbatches++] = b;
		b = NULL;
	}
	pthread_mutex_unlock(&self->pool_lock);
	stk_batch_destroy(b);
}

/* ---- File ---- */

typedef struct {
	PyObject_HEAD ClientObject *client; /* strong reference */
	stk_file *f;
	PyObject *name;
	PyObject *mode;
	int readable, writable;
	int closed; /* close() called; f is released when busy drops to 0 */
	unsigned busy;
	int close_rc; /* error of a close deferred to the last caller */
} FileObject;

static PyTypeObject FileType;

/* Releases the handle. Returns stk_close's result. Called with the GIL held. */
static int file_release(FileObject *self)
{
	stk_file *f = self->f;
	int rc;

	if (!f)
		return 0;
	self->f = NULL;
	if (self->client->pid != getpid() && self->client->c)
		client_after_fork(self->client);
	Py_BEGIN_ALLOW_THREADS rc = stk_close(f);
	Py_END_ALLOW_THREADS self->client->nfiles--;
	client_maybe_disconnect(self->client);
	return rc;
}

static int file_enter(FileObject *self)
{
	if (self->closed || !self->f) {
		raise_closed("I/O operation on closed file");
		return -1;
	}
	if (client_enter_ex(self->client, 1))
		return -1;
	self->busy++;
	return 0;
}

static void file_leave(FileObject *self)
{
	self->busy--;
	if (self->closed && !self->busy)
		self->close_rc = file_release(self);
	client_leave(self->client);
}

static PyObject *file_raise(FileObject *self, int rc)
{
	return raise_rc(rc, self->name);
}

static void file_dealloc(FileObject *self)
{
	self->closed = 1;
	if (!self->busy)
		file_release(self);
	Py_XDECREF(self->name);
	Py_XDECREF(self->mode);
	Py_XDECREF(self->client);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *file_close(FileObject *self, PyObject *unused)
{
	int rc = 0;

	if (self->closed)
		Py_RETURN_NONE;
	self->closed = 1;
	if (!self->busy)
		rc = file_release(self);
	if (rc)
		return file_raise(self, rc);
	Py_RETURN_NONE;
}

/* Reads up to n bytes (n < 0: to the end) at the position, or at off if off >= 0. */
static PyObject *do_read(FileObject *self, Py_ssize_t n, long long off)
{
	PyObject *out = NULL;
	ssize_t got = 0;
	int rc = 0;

	if (!self->readable) {
		return raise_rc(-EBADF, self->name);
	}
	if (file_enter(self))
		return NULL;
	if (n < 0) {
		uint64_t size = stk_file_size(self->f);
		uint64_t pos = off >= 0 ? (uint64_t)off : (uint64_t)stk_lseek(self->f, 0, SEEK_CUR);
		n = pos < size ? (Py_ssize_t)(size - pos) : 0;
	}
	out = PyBytes_FromStringAndSize(NULL, n);
	if (!out)
		goto out;
	if (n) {
		char *p = PyBytes_AS_STRING(out);
		Py_BEGIN_ALLOW_THREADS got = off >= 0 ? stk_pread(self->f, p, (size_t)n, (off_t)off)
						      : stk_read(self->f, p, (size_t)n);
		Py_END_ALLOW_THREADS if (got < 0)
		{
			rc = (int)got;
			Py_CLEAR(out);
		}
		else if (got < n && _PyBytes_Resize(&out, got) < 0)
		{
			out = NULL;
		}
	}
out:
	file_leave(self);
	if (rc)
		return file_raise(self, rc);
	return out;
}

static PyObject *file_read(FileObject *self, PyObject *args)
{
	Py_ssize_t n = -1;

	if (!PyArg_ParseTuple(args, "|n:read", &n))
		return NULL;
	return do_read(self, n, -1);
}

static PyObject *file_pread(FileObject *self, PyObject *args)
{
	Py_ssize_t n;
	long long off;

	if (!PyArg_ParseTuple(args, "nL:pread", &n, &off))
		return NULL;
	if (off < 0)
		return raise_rc(-EINVAL, self->name);
	return do_read(self, n, off);
}

static PyObject *do_readinto(FileObject *self, PyObject *obj, long long off)
{
	Py_buffer view;
	ssize_t got = 0;

	if (!self->readable)
		return raise_rc(-EBADF, self->name);
	if (PyObject_GetBuffer(obj, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
		return NULL;
	if (file_enter(self)) {
		PyBuffer_Release(&view);
		return NULL;
	}
	if (view.len) {
		Py_BEGIN_ALLOW_THREADS got =
		    off >= 0 ? stk_pread(self->f, view.buf, (size_t)view.len, (off_t)off)
			     : stk_read(self->f, view.buf, (size_t)view.len);
		Py_END_ALLOW_THREADS
	}
	file_leave(self);
	PyBuffer_Release(&view);
	if (got < 0)
		return file_raise(self, (int)got);
	return PyLong_FromSsize_t(got);
}

static PyObject *file_readinto(FileObject *self, PyObject *obj)
{
	return do_readinto(self, obj, -1);
}

static PyObject *file_preadinto(FileObject *self, PyObject *args)
{
	PyObject *obj;
	long long off;

	if (!PyArg_ParseTuple(args, "OL:preadinto", &obj, &off))
		return NULL;
	if (off < 0)
		return raise_rc(-EINVAL, self->name);
	return do_readinto(self, obj, off);
}

static PyObject *do_write(FileObject *self, PyObject *obj, long long off)
{
	Py_buffer view;
	ssize_t put = 0;

	if (!self->writable)
		return raise_rc(-EBADF, self->name);
	if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0)
		return NULL;
	if (file_enter(self)) {
		PyBuffer_Release(&view);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS put =
	    off >= 0 ? stk_pwrite(self->f, view.buf, (size_t)view.len, (off_t)off)
		     : stk_write(self->f, view.buf, (size_t)view.len);
	Py_END_ALLOW_THREADS file_leave(self);
	PyBuffer_Release(&view);
	if (put < 0)
		return file_raise(self, (int)put);
	return PyLong_FromSsize_t(put);
}

static PyObject *file_write(FileObject *self, PyObject *obj)
{
	return do_write(self, obj, -1);
}

static PyObject *file_pwrite(FileObject *self, PyObject *args)
{
	PyObject *obj;
	long long off;

	if (!PyArg_ParseTuple(args, "OL:pwrite", &obj, &off))
		return NULL;
	if (off < 0)
		return raise_rc(-EINVAL, self->name);
	return do_write(self, obj, off);
}

static PyObject *file_seek(FileObject *self, PyObject *args)
{
	long long off;
	int whence = SEEK_SET;
	off_t pos;

	if (!PyArg_ParseTuple(args, "L|i:seek", &off, &whence))
		return NULL;
	if (file_enter(self))
		return NULL;
	pos = stk_lseek(self->f, (off_t)off, whence);
	file_leave(self);
	if (pos < 0)
		return file_raise(self, (int)pos);
	return PyLong_FromLongLong((long long)pos);
}

static PyObject *file_tell(FileObject *self, PyObject *unused)
{
	off_t pos;

	if (file_enter(self))
		return NULL;
	pos = stk_lseek(self->f, 0, SEEK_CUR);
	file_leave(self);
	return PyLong_FromLongLong((long long)pos);
}

static PyObject *file_fsync(FileObject *self, PyObject *unused)
{
	int rc;

	if (file_enter(self))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = stk_fsync(self->f);
	Py_END_ALLOW_THREADS file_leave(self);
	if (rc)
		return file_raise(self, rc);
	Py_RETURN_NONE;
}

static PyObject *file_truncate(FileObject *self, PyObject *args)
{
	PyObject *sz = Py_None;
	long long size;
	int rc;

	if (!PyArg_ParseTuple(args, "|O:truncate", &sz))
		return NULL;
	if (file_enter(self))
		return NULL;
	if (sz == Py_None) {
		size = (long long)stk_lseek(self->f, 0, SEEK_CUR);
	} else {
		size = PyLong_AsLongLong(sz);
		if (size == -1 && PyErr_Occurred()) {
			file_leave(self);
			return NULL;
		}
	}
	Py_BEGIN_ALLOW_THREADS rc = stk_ftruncate(self->f, (off_t)size);
	Py_END_ALLOW_THREADS file_leave(self);
	if (rc)
		return file_raise(self, rc);
	return PyLong_FromLongLong(size);
}

static PyObject *stat_tuple(const struct stat *st)
{
	return Py_BuildValue("(IKKKIIL LLL LL)", (unsigned)st->st_mode,
			     (unsigned long long)st->st_ino, (unsigned long long)st->st_dev,
			     (unsigned long long)st->st_nlink, (unsigned)st->st_uid,
			     (unsigned)st->st_gid, (long long)st->st_size,
			     (long long)st->st_atim.tv_sec * 1000000000LL + st->st_atim.tv_nsec,
			     (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec,
			     (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec,
			     (long long)st->st_blksize, (long long)st->st_blocks);
}

static PyObject *file_fstat(FileObject *self, PyObject *unused)
{
	struct stat st;
	int rc;

	if (file_enter(self))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = stk_fstat(self->f, &st);
	Py_END_ALLOW_THREADS file_leave(self);
	if (rc)
		return file_raise(self, rc);
	return stat_tuple(&st);
}

static PyObject *file_get_size(FileObject *self, void *unused)
{
	uint64_t size;

	if (file_enter(self))
		return NULL;
	size = stk_file_size(self->f);
	file_leave(self);
	return PyLong_FromUnsignedLongLong(size);
}

static PyObject *file_get_closed(FileObject *self, void *unused)
{
	return PyBool_FromLong(self->closed);
}

static PyObject *file_readable(FileObject *self, PyObject *unused)
{
	if (self->closed)
		return raise_closed("I/O operation on closed file");
	return PyBool_FromLong(self->readable);
}

static PyObject *file_writable(FileObject *self, PyObject *unused)
{
	if (self->closed)
		return raise_closed("I/O operation on closed file");
	return PyBool_FromLong(self->writable);
}

static PyObject *file_seekable(FileObject *self, PyObject *unused)
{
	if (self->closed)
		return raise_closed("I/O operation on closed file");
	Py_RETURN_TRUE;
}

static PyObject *file_flush(FileObject *self, PyObject *unused)
{
	if (self->closed)
		return raise_closed("I/O operation on closed file");
	Py_RETURN_NONE; /* buffered bytes reach storage at fsync/close, as documented */
}

static PyObject *file_enter_ctx(FileObject *self, PyObject *unused)
{
	if (self->closed)
		return raise_closed("I/O operation on closed file");
	Py_INCREF(self);
	return (PyObject *)self;
}

static PyObject *file_exit_ctx(FileObject *self, PyObject *args)
{
	return file_close(self, NULL);
}

static PyObject *file_repr(FileObject *self)
{
	return PyUnicode_FromFormat("<stoker.File name=%R mode=%R%s>", self->name, self->mode,
				    self->closed ? " closed" : "");
}

static PyMethodDef file_methods[] = {
    {"read", (PyCFunction)file_read, METH_VARARGS,
     "read(n=-1) -> bytes: up to n bytes at the position (n < 0: to the end)."},
    {"pread", (PyCFunction)file_pread, METH_VARARGS,
     "pread(n, offset) -> bytes, without moving the position."},
    {"readinto", (PyCFunction)file_readinto, METH_O,
     "readinto(buf) -> int: fills a writable buffer in place."},
    {"preadinto", (PyCFunction)file_preadinto, METH_VARARGS, "preadinto(buf, offset) -> int."},
    {"write", (PyCFunction)file_write, METH_O, "write(data) -> int."},
    {"pwrite", (PyCFunction)file_pwrite, METH_VARARGS, "pwrite(data, offset) -> int."},
    {"seek", (PyCFunction)file_seek, METH_VARARGS, "seek(offset, whence=0) -> new position."},
    {"tell", (PyCFunction)file_tell, METH_NOARGS, "tell() -> position."},
    {"fsync", (PyCFunction)file_fsync, METH_NOARGS,
     "fsync(): makes every write durable and visible."},
    {"flush", (PyCFunction)file_flush, METH_NOARGS, "flush(): no-op; see fsync()."},
    {"truncate", (PyCFunction)file_truncate, METH_VARARGS, "truncate(size=None) -> size."},
    {"fstat", (PyCFunction)file_fstat, METH_NOARGS, "fstat() -> stat tuple (see stoker.stat)."},
    {"close", (PyCFunction)file_close, METH_NOARGS, "close(): flushes, makes durable, releases."},
    {"readable", (PyCFunction)file_readable, METH_NOARGS, NULL},
    {"writable", (PyCFunction)file_writable, METH_NOARGS, NULL},
    {"seekable", (PyCFunction)file_seekable, METH_NOARGS, NULL},
    {"__enter__", (PyCFunction)file_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)file_exit_ctx, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef file_getset[] = {
    {"closed", (getter)file_get_closed, NULL, "True once close() was called", NULL},
    {"size", (getter)file_get_size, NULL, "the size as this handle knows it (no round trip)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef file_members[] = {
    {"name", T_OBJECT, offsetof(FileObject, name), READONLY, "the path opened"},
    {"mode", T_OBJECT, offsetof(FileObject, mode), READONLY, "the mode string"},
    {"client", T_OBJECT, offsetof(FileObject, client), READONLY, "the Client"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FileType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoker._stoker.File",
    .tp_basicsize = sizeof(FileObject),
    .tp_dealloc = (destructor)file_dealloc,
    .tp_repr = (reprfunc)file_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "An open Stoker file; made by Client.open().",
    .tp_methods = file_methods,
    .tp_getset = file_getset,
    .tp_members = file_members,
};

/* ---- Client methods ---- */

/* Path argument converter result: a bytes object (owned). */
#define PATH_ARG(o) PyBytes_AS_STRING(o)

static PyObject *client_open(ClientObject *self, PyObject *args)
{
	PyObject *path = NULL, *mode = NULL, *name = NULL;
	int flags, perm = 0644, rc;
	FileObject *fo = NULL;
	stk_file *f = NULL;

	if (!PyArg_ParseTuple(args, "O&iU|i:_open", PyUnicode_FSConverter, &path, &flags, &mode,
			      &perm))
		return NULL;
	name = PyUnicode_DecodeFSDefault(PATH_ARG(path));
	if (!name || client_enter(self))
		goto out;
	Py_BEGIN_ALLOW_THREADS rc = stk_open(self->c, PATH_ARG(path), flags, (mode_t)perm, &f);
	Py_END_ALLOW_THREADS client_leave(self);
	if (rc) {
		raise_rc(rc, name);
		goto out;
	}
	fo = PyObject_New(FileObject, &FileType);
	if (!fo) {
		Py_BEGIN_ALLOW_THREADS stk_close(f);
		Py_END_ALLOW_THREADS goto out;
	}
	Py_INCREF(self);
	fo->client = self;
	fo->f = f;
	fo->name = name;
	name = NULL;
	Py_INCREF(mode);
	fo->mode = mode;
	fo->readable = (flags & O_ACCMODE) != O_WRONLY;
	fo->writable = (flags & O_ACCMODE) != O_RDONLY;
	fo->closed = 0;
	fo->busy = 0;
	fo->close_rc = 0;
	self->nfiles++;
out:
	Py_XDECREF(path);
	Py_XDECREF(name);
	return (PyObject *)fo;
}

/* Runs fn(c, path) with the GIL released; raises with the path as filename. */
#define PATH_CALL(self, pathobj, call)                                                             \
	do {                                                                                       \
		int rc_;                                                                           \
		if (client_enter(self))                                                            \
			goto out;                                                                  \
		Py_BEGIN_ALLOW_THREADS rc_ = (call);                                               \
		Py_END_ALLOW_THREADS client_leave(self);                                           \
		if (rc_ < 0) {                                                                     \
			PyObject *n_ = PyUnicode_DecodeFSDefault(PATH_ARG(pathobj));               \
			raise_rc(rc_, n_);                                                         \
			Py_XDECREF(n_);                                                            \
			goto out;                                                                  \
		}                                                                                  \
	} while (0)

static PyObject *client_stat(ClientObject *self, PyObject *args)
{
	PyObject *path = NULL, *res = NULL;
	struct stat st;

	if (!PyArg_ParseTuple(args, "O&:_stat", PyUnicode_FSConverter, &path))
		return NULL;
	PATH_CALL(self, path, stk_stat(self->c, PATH_ARG(path), &st));
	res = stat_tuple(&st);
out:
	Py_XDECREF(path);
	return res;
}

static PyObject *client_mkdir(ClientObject *self, PyObject *args)
{
	PyObject *path = NULL, *res = NULL;
	int mode = 0755;

	if (!PyArg_ParseTuple(args, "O&|i:mkdir", PyUnicode_FSConverter, &path, &mode))
		return NULL;
	PATH_CALL(self, path, stk_mkdir(self->c, PATH_ARG(path), (mode_t)mode));
	res = Py_NewRef(Py_None);
out:
	Py_XDECREF(path);
	return res;
}

static PyObject *client_rmdir(ClientObject *self, PyObject *args)
{
	PyObject *path = NULL, *res = NULL;

	if (!PyArg_ParseTuple(args, "O&:rmdir", PyUnicode_FSConverter, &path))
		return NULL;
	PATH_CALL(self, path, stk_rmdir(self->c, PATH_ARG(path)));
	res = Py_NewRef(Py_None);
out:
	Py_XDECREF(path);
	return res;
}

static PyObject *client_unlink(ClientObject *self, PyObject *args)
{
	PyObject *path = NULL, *res = NULL;

	if (!PyArg_ParseTuple(args, "O&:unlink", PyUnicode_FSConverter, &path))
		return NULL;
	PATH_CALL(self, path, stk_unlink(self->c, PATH_ARG(path)));
	res = Py_NewRef(Py_None);
out:
	Py_XDECREF(path);
	return res;
}

static PyObject *client_truncate(ClientObject *self, PyObject *args)
{
	PyObject *path = NULL, *res = NULL;
	long long size;

	if (!PyArg_ParseTuple(args, "O&L:truncate", PyUnicode_FSConverter, &path, &size))
		return NULL;
	PATH_CALL(self, path, stk_truncate(self->c, PATH_ARG(path), (off_t)size));
	res = Py_NewRef(Py_None);
out:
	Py_XDECREF(path);
	return res;
}

static PyObject *client_rename(ClientObject *self, PyObject *args)
{
	PyObject *src = NULL, *dst = NULL, *res = NULL;
	unsigned flags = 0;

	if (!PyArg_ParseTuple(args, "O&O&|I:rename", PyUnicode_FSConverter, &src,
			      PyUnicode_FSConverter, &dst, &flags))
		goto out;
	PATH_CALL(self, src, stk_rename(self->c, PATH_ARG(src), PATH_ARG(dst), flags));
	res = Py_NewRef(Py_None);
out:
	Py_XDECREF(src);
	Py_XDECREF(dst);
	return res;
}

static PyObject *client_symlink(ClientObject *self, PyObject *args)
{
	PyObject *target = NULL, *link = NULL, *res = NULL;

	if (!PyArg_ParseTuple(args, "O&O&:symlink", PyUnicode_FSConverter, &target,
			      PyUnicode_FSConverter, &link))
		goto out;
	PATH_CALL(self, link, stk_symlink(self->c, PATH_ARG(target), PATH_ARG(link)));
	res = Py_NewRef(Py_None);
out:
	Py_XDECREF(target);
	Py_XDECREF(link);
	return res;
}

static PyObject *client_readlink(ClientObject *self, PyObject *args)
{
	PyObject *path = NULL, *res = NULL;
	char buf[4097];

	if (!PyArg_ParseTuple(args, "O&:readlink", PyUnicode_FSConverter, &path))
		return NULL;
	PATH_CALL(self, path, (int)stk_readlink(self->c, PATH_ARG(path), buf, sizeof(buf)));
	res = PyUnicode_DecodeFSDefault(buf);
out:
	Py_XDECREF(path);
	return res;
}

static PyObject *client_statvfs(ClientObject *self, PyObject *unused)
{
	struct statvfs sv;
	int rc;

	if (client_enter(self))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = stk_statfs(self->c, &sv);
	Py_END_ALLOW_THREADS client_leave(self);
	if (rc)
		return raise_rc(rc, NULL);
	return Py_BuildValue("(kkKKKKKKkk)", sv.f_bsize, sv.f_frsize,
			     (unsigned long long)sv.f_blocks, (unsigned long long)sv.f_bfree,
			     (unsigned long long)sv.f_bavail, (unsigned long long)sv.f_files,
			     (unsigned long long)sv.f_ffree, (unsigned long long)sv.f_favail,
			     sv.f_flag, sv.f_namemax);
}

/* Lists a directory: [(name, d_type), ...], "." and ".." left out. */
static PyObject *client_scandir(ClientObject *self, PyObject *args)
{
	PyObject *path = NULL, *res = NULL, *list = NULL;
	struct dirent *ents = NULL;
	size_t n = 0, cap = 0;
	stk_dir *d = NULL;
	int rc = 0;

	if (!PyArg_ParseTuple(args, "O&:_scandir", PyUnicode_FSConverter, &path))
		return NULL;
	if (client_enter(self))
		goto out;
	Py_BEGIN_ALLOW_THREADS rc = stk_opendir(self->c, PATH_ARG(path), &d);
	while (rc == 0) {
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 256;
			struct dirent *ne = realloc(ents, ncap * sizeof(*ents));
			if (!ne) {
				rc = -ENOMEM;
				break;
			}
			ents = ne;
			cap = ncap;
		}
		rc = stk_readdir(d, &ents[n]);
		if (rc == 1) {
			n++;
			rc = 0;
		} else {
			break;
		}
	}
	if (d)
		stk_closedir(d);
	Py_END_ALLOW_THREADS client_leave(self);
	if (rc < 0) {
		PyObject *nm = PyUnicode_DecodeFSDefault(PATH_ARG(path));
		raise_rc(rc, nm);
		Py_XDECREF(nm);
		goto out;
	}
	list = PyList_New((Py_ssize_t)n);
	if (!list)
		goto out;
	for (size_t i = 0; i < n; i++) {
		PyObject *t = Py_BuildValue("(O&i)", PyUnicode_DecodeFSDefault, ents[i].d_name,
					    (int)ents[i].d_type);
		if (!t)
			goto out;
		PyList_SET_ITEM(list, (Py_ssize_t)i, t);
	}
	res = list;
	list = NULL;
out:
	free(ents);
	Py_XDECREF(list);
	Py_XDECREF(path);
	return res;
}

/* ---- read_batch ---- */

struct rb_item {
	PyObject *path;	  /* bytes (owned) when the request names a path */
	FileObject *file; /* when it names an open File (entered) */
	long same_as;	  /* index of an earlier item with the same path, or -1 */
	stk_file *f;
	uint64_t off;
	long long len; /* -1: to the end of the file */
	char *dst;
	Py_buffer view;
	int have_view;
	PyObject *out; /* bytes when no buffers were given */
	int64_t result;
	int open_rc;
};

struct rb_open {
	stk_client *c;
	struct rb_item *items;
	size_t n;
	size_t next; /* atomically taken */
};

static void *rb_open_thread(void *arg)
{
	struct rb_open *o = arg;

	for (;;) {
		size_t i = __atomic_fetch_add(&o->next, 1, __ATOMIC_RELAXED);
		struct rb_item *it;

		if (i >= o->n)
			break;
		it = &o->items[i];
		if (it->path && it->same_as < 0)
			it->open_rc =
			    stk_open(o->c, PyBytes_AS_STRING(it->path), O_RDONLY, 0, &it->f);
	}
	return NULL;
}

/* Opens every path on up to OPEN_THREADS threads (the calling one included). */
static void rb_open_all(stk_client *c, struct rb_item *items, size_t n, size_t nopen)
{
	struct rb_open o = {.c = c, .items = items, .n = n, .next = 0};
	pthread_t th[OPEN_THREADS];
	size_t nt = nopen / 4;
	size_t started = 0;

	if (nt > OPEN_THREADS - 1)
		nt = OPEN_THREADS - 1;
	for (; started < nt; started++)
		if (pthread_create(&th[started], NULL, rb_open_thread, &o))
			break;
	rb_open_thread(&o);
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	for (size_t i = 0; i < n; i++) {
		if (items[i].same_as >= 0) {
			items[i].f = items[items[i].same_as].f;
			items[i].open_rc = items[items[i].same_as].open_rc;
		}
	}
}

/* Submits every read and reaps them all; results in items[].result. GIL released. */
static int rb_run(ClientObject *self, struct rb_item *items, size_t n)
{
	struct stk_batch_req reqs[64];
	struct stk_completion comp[64];
	size_t next = 0, done = 0;
	stk_batch *b;
	int rc = 0;

	b = batch_get(self, &rc);
	if (!b)
		return rc;
	while (done < n) {
		unsigned k = 0;
		int got;

		/* Submit what the queue takes, a slice at a time. */
		while (next < n) {
			k = 0;
			while (next + k < n && k < 64) {
				struct rb_item *it = &items[next + k];
				reqs[k] = (struct stk_batch_req){.op = STK_BATCH_READ,
								 .file = it->f,
								 .offset = it->off,
								 .buf = it->dst,
								 .len = (size_t)it->len,
								 .user_data = next + k};
				k++;
			}
			got = stk_batch_submit(b, reqs, k);
			if (got <= 0)
				break;
			next += (size_t)got;
			if ((unsigned)got < k)
				break;
		}
		got = stk_batch_reap(b, comp, 64, 1, -1);
		if (got < 0) {
			rc = got;
			break;
		}
		for (int i = 0; i < got; i++)
			items[comp[i].user_data].result = comp[i].result;
		done += (size_t)got;
	}
	batch_put(self, b);
	return rc;
}

static void rb_cleanup(struct rb_item *items, size_t n)
{
	/* Handles opened here are read-only: closing one sends nothing. */
	Py_BEGIN_ALLOW_THREADS for (size_t i = 0; i < n;
				    i++) if (items[i].path && items[i].same_as < 0 && items[i].f)
	    stk_close(items[i].f);
	Py_END_ALLOW_THREADS for (size_t i = 0; i < n; i++)
	{
		struct rb_item *it = &items[i];
		Py_XDECREF(it->path);
		if (it->file) {
			file_leave(it->file);
			Py_DECREF(it->file);
		}
		if (it->have_view)
			PyBuffer_Release(&it->view);
		Py_XDECREF(it->out);
	}
	free(items);
}

static PyObject *client_read_batch(ClientObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"reqs", "bufs", NULL};
	PyObject *reqs_obj, *bufs_obj = Py_None, *reqs = NULL, *bufs = NULL, *seen = NULL;
	PyObject *res = NULL;
	struct rb_item *items = NULL;
	Py_ssize_t n = 0;
	size_t nopen = 0;
	int entered = 0, rc = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:read_batch", kwlist, &reqs_obj, &bufs_obj))
		return NULL;
	reqs = PySequence_Fast(reqs_obj, "read_batch: reqs must be a sequence");
	if (!reqs)
		return NULL;
	n = PySequence_Fast_GET_SIZE(reqs);
	if (bufs_obj != Py_None) {
		bufs = PySequence_Fast(bufs_obj, "read_batch: bufs must be a sequence");
		if (!bufs)
			goto out;
		if (PySequence_Fast_GET_SIZE(bufs) != n) {
			PyErr_SetString(PyExc_ValueError, "read_batch: one buffer per request");
			goto out;
		}
	}
	items = calloc((size_t)(n ? n : 1), sizeof(*items));
	seen = PyDict_New();
	if (!items || !seen) {
		PyErr_NoMemory();
		goto out;
	}
	if (client_enter(self))
		goto out;
	entered = 1;
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *r = PySequence_Fast_GET_ITEM(reqs, i), *target, *lenobj;
		struct rb_item *it = &items[i];
		long long off;

		it->same_as = -1;
		if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 3) {
			PyErr_SetString(
			    PyExc_TypeError,
			    "read_batch: each request is (path or File, offset, length)");
			goto out;
		}
		target = PyTuple_GET_ITEM(r, 0);
		off = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 1));
		if (off == -1 && PyErr_Occurred())
			goto out;
		lenobj = PyTuple_GET_ITEM(r, 2);
		it->len = lenobj == Py_None ? -1 : PyLong_AsLongLong(lenobj);
		if (it->len == -1 && PyErr_Occurred())
			goto out;
		if (off < 0 || it->len < -1) {
			PyObject *nm = PyObject_Str(target);
			raise_rc(-EINVAL, nm);
			Py_XDECREF(nm);
			goto out;
		}
		it->off = (uint64_t)off;
		if (PyObject_TypeCheck(target, &FileType)) {
			FileObject *fo = (FileObject *)target;
			if (fo->client != self) {
				PyErr_SetString(PyExc_ValueError,
						"read_batch: a File of another Client");
				goto out;
			}
			if (!fo->readable) {
				raise_rc(-EBADF, fo->name);
				goto out;
			}
			if (file_enter(fo))
				goto out;
			Py_INCREF(fo);
			it->file = fo;
			it->f = fo->f;
		} else {
			PyObject *prev;
			if (!PyUnicode_FSConverter(target, &it->path))
				goto out;
			prev = PyDict_GetItemWithError(seen, it->path);
			if (prev) {
				it->same_as = PyLong_AsLong(prev);
			} else {
				PyObject *idx = PyErr_Occurred() ? NULL : PyLong_FromSsize_t(i);
				if (!idx || PyDict_SetItem(seen, it->path, idx) < 0) {
					Py_XDECREF(idx);
					goto out;
				}
				Py_DECREF(idx);
				nopen++;
			}
		}
		if (bufs) {
			PyObject *bo = PySequence_Fast_GET_ITEM(bufs, i);
			if (PyObject_GetBuffer(bo, &it->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) <
			    0)
				goto out;
			it->have_view = 1;
			if (it->len < 0)
				it->len = it->view.len;
			if (it->len > it->view.len) {
				PyErr_Format(
				    PyExc_ValueError,
				    "read_batch: request %zd reads %lld bytes into a buffer of %zd",
				    i, it->len, it->view.len);
				goto out;
			}
			it->dst = it->view.buf;
		}
	}
	if (nopen) {
		Py_BEGIN_ALLOW_THREADS rb_open_all(self->c, items, (size_t)n, nopen);
		Py_END_ALLOW_THREADS
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		struct rb_item *it = &items[i];
		if (it->open_rc) {
			PyObject *nm = PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(it->path));
			raise_rc(it->open_rc, nm);
			Py_XDECREF(nm);
			goto out;
		}
		if (it->len < 0) {
			uint64_t size = stk_file_size(it->f);
			it->len = it->off < size ? (long long)(size - it->off) : 0;
		}
		if (!bufs) {
			it->out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)it->len);
			if (!it->out)
				goto out;
			it->dst = PyBytes_AS_STRING(it->out);
		}
	}
	Py_BEGIN_ALLOW_THREADS rc = rb_run(self, items, (size_t)n);
	Py_END_ALLOW_THREADS if (rc)
	{
		raise_rc(rc, NULL);
		goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		struct rb_item *it = &items[i];
		if (it->result < 0) {
			PyObject *nm = it->file
					   ? Py_NewRef(it->file->name)
					   : PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(it->path));
			raise_rc((int)it->result, nm);
			Py_XDECREF(nm);
			goto out;
		}
	}
	res = PyList_New(n);
	if (!res)
		goto out;
	for (Py_ssize_t i = 0; i < n; i++) {
		struct rb_item *it = &items[i];
		PyObject *v;
		if (bufs) {
			v = PyLong_FromLongLong(it->result);
		} else {
			if (it->result < it->len &&
			    _PyBytes_Resize(&it->out, (Py_ssize_t)it->result) < 0) {
				it->out = NULL;
				Py_CLEAR(res);
				goto out;
			}
			v = it->out;
			it->out = NULL;
		}
		if (!v) {
			Py_CLEAR(res);
			goto out;
		}
		PyList_SET_ITEM(res, i, v);
	}
out:
	if (items)
		rb_cleanup(items, (size_t)n);
	if (entered)
		client_leave(self);
	Py_XDECREF(seen);
	Py_XDECREF(bufs);
	Py_XDECREF(reqs);
	return res;
}

static PyObject *client_enter_ctx(ClientObject *self, PyObject *unused)
{
	Py_INCREF(self);
	return (PyObject *)self;
}

static PyObject *client_exit_ctx(ClientObject *self, PyObject *args)
{
	return client_close(self, NULL);
}

static PyMethodDef client_methods[] = {
    {"_open", (PyCFunction)client_open, METH_VARARGS,
     "_open(path, flags, mode_str, perm=0o644) -> File"},
    {"_stat", (PyCFunction)client_stat, METH_VARARGS, "_stat(path) -> stat tuple"},
    {"_scandir", (PyCFunction)client_scandir, METH_VARARGS, "_scandir(path) -> [(name, d_type)]"},
    {"mkdir", (PyCFunction)client_mkdir, METH_VARARGS, "mkdir(path, mode=0o755)"},
    {"rmdir", (PyCFunction)client_rmdir, METH_VARARGS, "rmdir(path)"},
    {"unlink", (PyCFunction)client_unlink, METH_VARARGS, "unlink(path)"},
    {"truncate", (PyCFunction)client_truncate, METH_VARARGS, "truncate(path, size)"},
    {"rename", (PyCFunction)client_rename, METH_VARARGS, "rename(src, dst, flags=0): atomic"},
    {"symlink", (PyCFunction)client_symlink, METH_VARARGS, "symlink(target, linkpath)"},
    {"readlink", (PyCFunction)client_readlink, METH_VARARGS, "readlink(path) -> str"},
    {"_statvfs", (PyCFunction)client_statvfs, METH_NOARGS, "_statvfs() -> tuple"},
    {"read_batch", (PyCFunction)(void (*)(void))client_read_batch, METH_VARARGS | METH_KEYWORDS,
     "read_batch(reqs, bufs=None): reqs is a sequence of (path or File, offset, length or None);\n"
     "returns a list of bytes, or with bufs (one writable buffer per request) fills them and\n"
     "returns the byte counts. Raises the first failed request's OSError."},
    {"close", (PyCFunction)client_close, METH_NOARGS,
     "close(): disconnects once its files are closed"},
    {"__enter__", (PyCFunction)client_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)client_exit_ctx, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
    {"closed", (getter)client_get_closed, NULL, "True once close() was called", NULL},
    {"address", (getter)client_get_address, NULL, "the mgmtd HOST:PORT", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoker._stoker.Client",
    .tp_basicsize = sizeof(ClientObject),
    .tp_dealloc = (destructor)client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Client(cluster=None, conns_per_node=0, max_inflight=64, batch_threads=2, "
	      "write_buffer=0, stripe=0, chunk_size=0)",
    .tp_methods = client_methods,
    .tp_getset = client_getset,
    .tp_init = (initproc)client_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stoker._stoker",
    .m_doc = "The C binding of libstoker; use the `stoker` package.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__stoker(void)
{
	PyObject *m, *bases;

	if (PyType_Ready(&ClientType) < 0 || PyType_Ready(&FileType) < 0)
		return NULL;
	m = PyModule_Create(&module);
	if (!m)
		return NULL;
	bases = PyTuple_Pack(2, PyExc_OSError, PyExc_ValueError);
	if (!bases)
		goto fail;
	ClosedError = PyErr_NewExceptionWithDoc(
	    "stoker.ClosedError",
	    "Use of a closed File or Client (errno EBADF); an OSError and a ValueError.", bases,
	    NULL);
	Py_DECREF(bases);
	if (!ClosedError)
		goto fail;
	Py_INCREF(ClosedError);
	if (PyModule_AddObject(m, "ClosedError", ClosedError) < 0)
		goto fail;
	Py_INCREF(&ClientType);
	if (PyModule_AddObject(m, "Client", (PyObject *)&ClientType) < 0)
		goto fail;
	Py_INCREF(&FileType);
	if (PyModule_AddObject(m, "File", (PyObject *)&FileType) < 0)
		goto fail;
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
