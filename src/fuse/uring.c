/*
 * FUSE over io_uring (Linux 6.14+, `-o uring`): the kernel hands each request to
 * a queue of the CPU its caller runs on, and a thread of ours pinned to that CPU
 * takes it from an io_uring, so the caller and the thread that serves it share a
 * CPU. Over /dev/fuse the kernel wakes whichever reader waits, most often on the
 * other, idle CPU, and on a virtual machine waking an idle CPU is the dearest
 * part of a request (docs/BENCHMARKS.md, "What limits each figure", W3 read).
 *
 * libfuse 3.14 knows nothing of this, so the transport sits under it:
 *   - fuse_session_custom_io() gives us its reads of and writes to /dev/fuse.
 *     Reads pass through; the reply to INIT is changed to ask for io_uring
 *     (FUSE_OVER_IO_URING, flags2 bit 9) when the kernel offered it.
 *   - After INIT, each worker thread registers one ring entry (a header buffer
 *     and a payload buffer) on its CPU's queue with FUSE_IO_URING_CMD_REGISTER.
 *     Once every queue has one, the kernel sends requests through them.
 *   - A request arrives as fuse_in_header and the op's fixed header in the header
 *     buffer and the rest in the payload buffer. The thread lays the headers just
 *     before the payload, which makes the same bytes /dev/fuse would have given,
 *     and calls fuse_session_process_buf().
 *   - Every reply goes through our writev: one to a request in flight on a ring
 *     entry is copied into that entry (out header, then the arguments as payload)
 *     and committed with FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which also asks for
 *     the entry's next request. Anything else (notifications, replies to what came
 *     through /dev/fuse) is written to /dev/fuse.
 * Forgets, interrupts and notifications keep using /dev/fuse (the kernel sends
 * them there), so libfuse's own loop keeps running beside the rings.
 *
 * When the kernel has it off (/sys/module/fuse/parameters/enable_uring) the mount
 * turns it on if it runs as root; if registering fails nothing is lost: requests
 * keep coming through /dev/fuse, and the mount logs why once.
 */
#include "fs.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"

/* The kernel's ABI (include/uapi/linux/fuse.h, 7.42), absent from Debian 12's headers. */
#define URING_HDR_SZ 128
#define URING_OP_SZ 128
#define FUSE_OVER_IO_URING_FLAGS2 (1u << 9) /* (1ULL << 41) in flags2 */
#define INIT_EXT (1u << 30)
#define OP_FORGET 2
#define OP_INIT 26
#define OP_BATCH_FORGET 42
#define CMD_REGISTER 1
#define CMD_COMMIT_AND_FETCH 2

struct ent_in_out {
	uint64_t flags;
	uint64_t commit_id;
	uint32_t payload_sz;
	uint32_t padding;
	uint64_t reserved;
};

struct req_header {
	uint8_t in_out[URING_HDR_SZ];
	uint8_t op_in[URING_OP_SZ];
	struct ent_in_out ring;
};

struct cmd_req {
	uint64_t flags;
	uint64_t commit_id;
	uint16_t qid;
	uint8_t padding[6];
};

struct in_hdr {
	uint32_t len, opcode;
	uint64_t unique, nodeid;
	uint32_t uid, gid, pid;
	uint16_t total_extlen, padding;
};

struct out_hdr {
	uint32_t len;
	int32_t error;
	uint64_t unique;
};

#define LEAD (sizeof(struct in_hdr) + URING_OP_SZ) /* room before the payload */
#define PAYLOAD (STK_FUSE_IO_MAX + (64u << 10))
#define STASH (68u << 10) /* the largest reply to a request with a payload (an xattr) */
/*
 * How long a /dev/fuse reader waits after a forget, while rings serve. The kernel
 * sends one FORGET per evicted inode when a reader waits and one BATCH_FORGET of
 * all pending ones otherwise; an unlink evicts its inode, and waking a reader per
 * unlink cost a context switch per file (W4 unlink). Only forgets, interrupts and
 * notifications come this way then, none of them waiting on the pause.
 */
#define FORGET_PAUSE_NS 5000000L

struct uthread {
	struct stk_fuse_uring *u;
	struct io_uring ring;
	int ring_ok;
	pthread_mutex_t sq_mu; /* replies may come from other threads (a granted lock) */
	pthread_t tid;
	int qid;
	struct req_header *hdr;
	uint8_t *buf; /* LEAD bytes, then the payload the kernel fills (stk_huge_alloc) */
	struct iovec iov[2];
	uint64_t cur; /* atomic: the unique of the request it serves, until replied (0) */
	/* Under mu: the request being served and its reply (put_reply says how). */
	pthread_mutex_t mu;
	int in_serve, pending, reply_stashed;
	uint32_t req_psz, reply_len;
	struct out_hdr reply;
	uint8_t *stash; /* STASH bytes */
};

struct stk_fuse_uring {
	struct fuse_session *se;
	int fd;
	unsigned nq, nthreads;
	struct uthread *th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t init_unique;
	int offered, init_done, stop;
	int serving; /* atomic: a request came through a ring */
	int announce, told; /* atomic: the log is in place; it was said */
};

static struct stk_fuse_uring *g_u; /* the custom io's userdata is the session's */
static __thread struct uthread *g_self; /* the ring thread this is, if one */

/*
 * Claims the entry whose request a reply answers: most often the thread replying
 * serves it itself; a reply made elsewhere (a lock granted later) looks through
 * every entry. NULL: none has it (a request that came through /dev/fuse).
 */
static struct uthread *claim(struct stk_fuse_uring *u, uint64_t unique)
{
	struct uthread *t = g_self;
	uint64_t want = unique;

	if (t && __atomic_compare_exchange_n(&t->cur, &want, 0, 0, __ATOMIC_ACQ_REL,
					     __ATOMIC_ACQUIRE))
		return t;
	for (unsigned i = 0; i < u->nthreads; i++) {
		want = unique;
		if (__atomic_compare_exchange_n(&u->th[i].cur, &want, 0, 0, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE))
			return &u->th[i];
	}
	return NULL;
}

/* Queues a uring command for t's entry (REGISTER or COMMIT_AND_FETCH); 0 or -errno. */
static int send_cmd(struct uthread *t, uint32_t op, uint64_t commit_id)
{
	struct io_uring_sqe *sqe;
	struct cmd_req *cr;
	int rc;

	pthread_mutex_lock(&t->sq_mu);
	sqe = io_uring_get_sqe(&t->ring);
	if (!sqe) {
		pthread_mutex_unlock(&t->sq_mu);
		return -EBUSY;
	}
	memset(sqe, 0, 128);
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = t->u->fd;
	sqe->cmd_op = op;
	if (op == CMD_REGISTER) {
		sqe->addr = (uint64_t)(uintptr_t)t->iov;
		sqe->len = 2;
	}
	cr = (struct cmd_req *)sqe->cmd;
	cr->qid = (uint16_t)t->qid;
	cr->commit_id = commit_id;
	io_uring_sqe_set_data(sqe, t);
	rc = io_uring_submit(&t->ring);
	pthread_mutex_unlock(&t->sq_mu);
	return rc < 0 ? rc : 0;
}

/* With t->mu: the reply in place goes to the kernel, which sends t's next request. */
static void commit_locked(struct uthread *t)
{
	int rc;

	if (t->reply_stashed)
		memcpy(t->buf + LEAD, t->stash, t->reply_len);
	memcpy(t->hdr->in_out, &t->reply, sizeof(t->reply));
	t->hdr->ring.payload_sz = t->reply_len;
	t->pending = 0;
	rc = send_cmd(t, CMD_COMMIT_AND_FETCH, t->reply.unique);
	if (rc)
		stk_error("io_uring: cannot commit a reply on queue %d: %s", t->qid,
			  stk_strerror(rc));
}

/*
 * A reply for the request in flight on t. The kernel writes t's next request
 * into the same buffers as soon as the entry is committed, and the handler may
 * still read its request after replying, so while t is inside serve() the reply
 * is only put in place and serve() commits it when libfuse is done. The reply's
 * arguments go straight to the payload buffer when the request had no payload
 * (its inputs all lie before the payload), else to the stash until then.
 * A reply that does not fit is answered EIO: the entry must be committed.
 */
static ssize_t put_reply(struct uthread *t, const struct iovec *iov, int count)
{
	struct out_hdr oh = *(const struct out_hdr *)iov[0].iov_base;
	size_t n = 0, cap;
	uint8_t *dst;

	pthread_mutex_lock(&t->mu);
	dst = t->in_serve && t->req_psz ? t->stash : t->buf + LEAD;
	cap = t->in_serve && t->req_psz ? STASH : PAYLOAD;
	for (int i = 1; i < count; i++)
		n += iov[i].iov_len;
	if (n > cap) {
		stk_warn("io_uring: a reply of %zu bytes to request %llu: EIO", n,
			 (unsigned long long)oh.unique);
		oh.error = -EIO;
		oh.len = sizeof(oh);
		n = 0;
	} else {
		n = 0;
		for (int i = 1; i < count; i++) {
			/* bytes read straight into the payload (stk_fuse_uring_buf) stay */
			if (iov[i].iov_base != dst + n)
				memmove(dst + n, iov[i].iov_base, iov[i].iov_len);
			n += iov[i].iov_len;
		}
	}
	t->reply = oh;
	t->reply_len = (uint32_t)n;
	t->reply_stashed = dst == t->stash;
	if (t->in_serve)
		t->pending = 1;
	else
		commit_locked(t);
	pthread_mutex_unlock(&t->mu);
	return (ssize_t)(sizeof(oh) + n);
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	struct stk_fuse_uring *u = g_u;
	struct out_hdr *oh = count > 0 && iov[0].iov_len >= sizeof(*oh) ? iov[0].iov_base : NULL;
	struct uthread *t;
	ssize_t r;

	if (u && oh && oh->unique) {
		if (oh->unique == u->init_unique && u->offered && count >= 2 &&
		    iov[1].iov_len >= 36) {
			/* fuse_init_out: flags at byte 12, flags2 at 32 */
			uint32_t *w = (uint32_t *)iov[1].iov_base;
			w[3] |= INIT_EXT;
			w[8] |= FUSE_OVER_IO_URING_FLAGS2;
			r = writev(fd, iov, count);
			pthread_mutex_lock(&u->mu);
			u->init_done = 1;
			pthread_cond_broadcast(&u->cv);
			pthread_mutex_unlock(&u->mu);
			return r;
		}
		t = claim(u, oh->unique);
		if (t)
			return put_reply(t, iov, count);
	}
	return writev(fd, iov, count);
}

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
	static __thread int forgot; /* this reader's last request was a forget */
	struct stk_fuse_uring *u = g_u;
	const struct in_hdr *ih = buf;
	ssize_t r;

	if (forgot && u && __atomic_load_n(&u->serving, __ATOMIC_RELAXED)) {
		struct timespec ts = {0, FORGET_PAUSE_NS};
		nanosleep(&ts, NULL);
	}
	r = read(fd, buf, len);
	forgot = r >= (ssize_t)sizeof(*ih) &&
		 (ih->opcode == OP_FORGET || ih->opcode == OP_BATCH_FORGET);
	if (u && r >= (ssize_t)(sizeof(*ih) + 16) && ih->opcode == OP_INIT) {
		/* fuse_init_in: major, minor, max_readahead, flags, then flags2 (7.36) */
		const uint32_t *w = (const uint32_t *)(ih + 1);
		u->init_unique = ih->unique;
		u->offered = r >= (ssize_t)(sizeof(*ih) + 24) && (w[3] & INIT_EXT) &&
			     (w[4] & FUSE_OVER_IO_URING_FLAGS2);
		if (!u->offered)
			stk_warn("io_uring: the kernel does not offer it (enable_uring off?); "
				 "serving through /dev/fuse");
	}
	return r;
}

/* Logs once that rings serve, when they do and the daemon's log is in place. */
static void announce(struct stk_fuse_uring *u)
{
	if (__atomic_load_n(&u->serving, __ATOMIC_SEQ_CST) &&
	    __atomic_load_n(&u->announce, __ATOMIC_SEQ_CST) &&
	    !__atomic_exchange_n(&u->told, 1, __ATOMIC_SEQ_CST))
		stk_info("io_uring: serving requests through %u queues (%u threads)", u->nq,
			 u->nthreads);
}

void *stk_fuse_uring_buf(size_t len)
{
	struct uthread *t = g_self;

	/* Only a request with no payload of its own leaves the payload buffer free. */
	if (!t || !t->in_serve || t->req_psz || len > PAYLOAD)
		return NULL;
	return t->buf + LEAD;
}

void stk_fuse_uring_roam(int on)
{
	struct uthread *t = g_self;
	cpu_set_t set;

	if (!t)
		return;
	CPU_ZERO(&set);
	if (on) {
		for (unsigned i = 0; i < g_u->nq && i < CPU_SETSIZE; i++)
			CPU_SET(i, &set); /* every possible CPU */
	} else {
		CPU_SET(t->qid, &set);
	}
	(void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

void stk_fuse_uring_announce(struct stk_fuse *fs)
{
	if (!fs->uring)
		return;
	__atomic_store_n(&fs->uring->announce, 1, __ATOMIC_SEQ_CST);
	announce(fs->uring);
}

/* One request on t's entry: made into /dev/fuse's layout and handed to libfuse. */
static void serve(struct uthread *t)
{
	struct in_hdr *ih = (struct in_hdr *)t->hdr->in_out;
	uint32_t psz = t->hdr->ring.payload_sz;
	uint32_t opsz;
	uint8_t *start;
	struct fuse_buf fb;

	if (ih->len < sizeof(*ih) + psz || ih->len - sizeof(*ih) - psz > URING_OP_SZ ||
	    psz > PAYLOAD) {
		struct out_hdr oh = {.len = sizeof(oh), .error = -EIO, .unique = ih->unique};
		struct iovec iov = {.iov_base = &oh, .iov_len = sizeof(oh)};
		stk_warn("io_uring: request %u of %u bytes with %u of payload: refused",
			 ih->opcode, ih->len, psz);
		pthread_mutex_lock(&t->mu);
		t->in_serve = 0;
		pthread_mutex_unlock(&t->mu);
		put_reply(t, &iov, 1);
		return;
	}
	opsz = ih->len - (uint32_t)sizeof(*ih) - psz;
	start = t->buf + LEAD - opsz - sizeof(*ih);
	memcpy(t->buf + LEAD - opsz, t->hdr->op_in, opsz);
	memcpy(start, ih, sizeof(*ih));
	pthread_mutex_lock(&t->mu);
	t->in_serve = 1;
	t->req_psz = psz;
	pthread_mutex_unlock(&t->mu);
	__atomic_store_n(&t->cur, ih->unique, __ATOMIC_RELEASE);
	memset(&fb, 0, sizeof(fb));
	fb.mem = start;
	fb.size = ih->len;
	fuse_session_process_buf(t->u->se, &fb);
	/* libfuse is done with the request: a reply made meanwhile may go now */
	pthread_mutex_lock(&t->mu);
	t->in_serve = 0;
	if (t->pending)
		commit_locked(t);
	pthread_mutex_unlock(&t->mu);
}

static void *thread_main(void *arg)
{
	struct uthread *t = arg;
	struct stk_fuse_uring *u = t->u;
	struct io_uring_cqe *cqe;
	cpu_set_t set;
	int rc, told = 0;

	g_self = t;
	CPU_ZERO(&set);
	CPU_SET(t->qid, &set);
	/* fails for an offline CPU: that thread then runs anywhere */
	(void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	pthread_mutex_lock(&u->mu);
	while (!u->init_done && !u->stop)
		pthread_cond_wait(&u->cv, &u->mu);
	pthread_mutex_unlock(&u->mu);
	if (u->stop || !u->offered)
		return NULL;
	rc = send_cmd(t, CMD_REGISTER, 0);
	if (rc) {
		stk_warn("io_uring: cannot register on queue %d: %s", t->qid, stk_strerror(rc));
		return NULL;
	}
	while (!__atomic_load_n(&u->stop, __ATOMIC_RELAXED)) {
		struct __kernel_timespec ts = {.tv_sec = 1};
		int res;

		rc = io_uring_wait_cqe_timeout(&t->ring, &cqe, &ts);
		if (rc == -ETIME || rc == -EINTR)
			continue;
		if (rc)
			break;
		res = cqe->res;
		io_uring_cqe_seen(&t->ring, cqe);
		if (res < 0) {
			if (!told++ && res != -ENOTCONN && res != -ECANCELED)
				stk_warn("io_uring: queue %d: %s", t->qid, stk_strerror(res));
			break;
		}
		if (!__atomic_load_n(&u->serving, __ATOMIC_RELAXED)) {
			__atomic_store_n(&u->serving, 1, __ATOMIC_SEQ_CST);
			announce(u);
		}
		serve(t);
	}
	return NULL;
}

/*
 * Reads a CPU list file ("0-3,8") into set; the highest CPU + 1, or 0 if the
 * file cannot be read or names a CPU of MAX_CPUS or more.
 */
#define MAX_CPUS 1024u
static unsigned cpu_list(const char *path, uint8_t *set)
{
	char b[4096], *p = b, *end;
	unsigned top = 0;
	FILE *f = fopen(path, "re");
	size_t n;

	if (!f)
		return 0;
	n = fread(b, 1, sizeof(b) - 1, f);
	fclose(f);
	b[n] = 0;
	while (*p && *p != '\n') {
		unsigned long lo = strtoul(p, &end, 10), hi = lo;
		if (end == p)
			return 0;
		p = end;
		if (*p == '-') {
			hi = strtoul(p + 1, &end, 10);
			if (end == p + 1)
				return 0;
			p = end;
		}
		if (hi < lo || hi >= MAX_CPUS)
			return 0;
		for (unsigned long c = lo; c <= hi; c++)
			set[c] = 1;
		top = (unsigned)STK_MAX(top, hi + 1);
		if (*p == ',')
			p++;
	}
	return top;
}

int stk_fuse_uring_setup(struct stk_fuse *fs)
{
	static const struct fuse_custom_io io = {.writev = io_writev, .read = io_read};
	uint8_t possible[MAX_CPUS] = {0}, online[MAX_CPUS] = {0};
	struct stk_fuse_uring *u;
	unsigned nq, non, per, k = 0;

	/* The kernel makes a queue per possible CPU and uses none until each has an entry. */
	nq = cpu_list("/sys/devices/system/cpu/possible", possible);
	non = 0;
	cpu_list("/sys/devices/system/cpu/online", online);
	for (unsigned c = 0; c < nq; c++)
		non += online[c];
	if (!nq || !non)
		return -EINVAL;
	u = calloc(1, sizeof(*u));
	if (!u)
		return -ENOMEM;
	u->se = fs->se;
	u->fd = fuse_session_fd(fs->se);
	u->nq = nq;
	/* As many request threads as over /dev/fuse, spread over the online CPUs. */
	per = STK_MAX(2u, (fs->o.max_threads ? fs->o.max_threads : 16u) / non);
	u->nthreads = non * per + (nq - non);
	pthread_mutex_init(&u->mu, NULL);
	pthread_cond_init(&u->cv, NULL);
	u->th = calloc(u->nthreads, sizeof(*u->th));
	if (!u->th) {
		free(u);
		return -ENOMEM;
	}
	/* Offline CPUs get one (unpinned) thread each: their queues must not be empty. */
	for (unsigned c = 0; c < nq; c++)
		for (unsigned i = 0; i < (online[c] ? per : 1u); i++)
			u->th[k++].qid = (int)c;
	g_u = u;
	if (fuse_session_custom_io(fs->se, &io, u->fd)) {
		g_u = NULL;
		free(u->th);
		free(u);
		return -EIO;
	}
	fs->uring = u;
	return 0;
}

int stk_fuse_uring_start(struct stk_fuse *fs)
{
	struct stk_fuse_uring *u = fs->uring;
	unsigned started = 0;

	if (!u)
		return 0;
	for (unsigned i = 0; i < u->nthreads; i++) {
		struct uthread *t = &u->th[i];
		struct io_uring_params p;

		t->u = u;
		pthread_mutex_init(&t->sq_mu, NULL);
		pthread_mutex_init(&t->mu, NULL);
		t->stash = malloc(STASH);
		t->hdr = aligned_alloc(4096, sizeof(*t->hdr) + 4096 - sizeof(*t->hdr) % 4096);
		/*
		 * The payload on a huge page boundary: a stream's reads go into it with
		 * O_DIRECT, one segment each (stk_huge_alloc).
		 */
		t->buf = stk_huge_alloc(LEAD + PAYLOAD, LEAD);
		if (!t->hdr || !t->buf || !t->stash)
			break;
		/* the payload starts LEAD bytes in: the headers go right before it */
		memset(t->hdr, 0, sizeof(*t->hdr));
		t->iov[0].iov_base = t->hdr;
		t->iov[0].iov_len = sizeof(*t->hdr);
		t->iov[1].iov_base = t->buf + LEAD;
		t->iov[1].iov_len = PAYLOAD;
		memset(&p, 0, sizeof(p));
		p.flags = IORING_SETUP_SQE128;
		if (io_uring_queue_init_params(4, &t->ring, &p) < 0)
			break;
		t->ring_ok = 1;
		if (pthread_create(&t->tid, NULL, thread_main, t)) {
			io_uring_queue_exit(&t->ring);
			t->ring_ok = 0;
			break;
		}
		started++;
	}
	if (started < u->nthreads)
		stk_warn("io_uring: %u of %u threads started", started, u->nthreads);
	return 0;
}

void stk_fuse_uring_stop(struct stk_fuse *fs)
{
	struct stk_fuse_uring *u = fs->uring;

	if (!u)
		return;
	pthread_mutex_lock(&u->mu);
	u->stop = 1;
	pthread_cond_broadcast(&u->cv);
	pthread_mutex_unlock(&u->mu);
	for (unsigned i = 0; i < u->nthreads; i++) {
		struct uthread *t = &u->th[i];
		if (t->ring_ok) {
			pthread_join(t->tid, NULL);
			io_uring_queue_exit(&t->ring);
		}
		free(t->hdr);
		stk_huge_free(t->buf, LEAD + PAYLOAD, LEAD);
		free(t->stash);
	}
	g_u = NULL;
	free(u->th);
	free(u);
	fs->uring = NULL;
}
