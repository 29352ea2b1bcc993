/*
 * The FUSE daemon behind `stoker mount`, shared between its files.
 *
 * mount.c  `stoker mount` and `stoker umount`: options, the checks made before
 *          mounting, daemonizing, the session and its threads, unmounting
 * ops.c    the low-level operations: each turns one kernel request into
 *          libstoker calls and replies exactly once
 * table.c  the open-file table: per inode, the handles open in this mount and
 *          the attributes seen at the last open
 * attrcache.c attributes the mount holds for the getattr after the kernel dropped them
 * notify.c the kernel's entries of names whose lease meta revoked, expired
 *
 * Inode numbers are Stoker's. The kernel's node id is the Stoker inode number,
 * except that the mounted directory is node 1 (FUSE_ROOT_ID): when a
 * subdirectory R is mounted, node 1 means R and node R means the cluster root
 * (which cannot appear below R), so the mapping is a swap and needs no table.
 * Nothing is remembered per lookup, so forget has nothing to do.
 *
 * Why an open-file table at all: libstoker buffers writes in a handle, and a
 * handle reads its own buffered writes but no other handle's. The kernel keeps
 * one page cache per inode for all its file descriptors, so within one mount a
 * read through any descriptor must see a write through any other. So all the
 * descriptors of an inode that is being written share one read-write libstoker
 * handle (node->wf), and reads through a read-only handle use it while it
 * exists. libstoker also tells meta the new size only at fsync and close, so
 * every attribute we reply with is overlaid with the size the shared handle's
 * writes reached. The table remembers each file's mtime and size at its last
 * open, so that an open of an unchanged file keeps the kernel's page cache
 * (keep_cache), and it keeps a file unlinked while open in this mount readable
 * until its last close.
 */
#ifndef STK_FUSE_FS_H
#define STK_FUSE_FS_H

#define FUSE_USE_VERSION 312

#include <fuse_lowlevel.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "stoker/stoker.h"

#include "stoker/stoker_ll.h"

/* Largest read and write request: the kernel's max_read and max_write. */
#define STK_FUSE_IO_MAX (1u << 20)

/* `stoker mount -o ...`; the defaults are set by stk_fuse_opts_default. */
struct stk_fuse_opts {
	double attr_timeout; /* seconds the kernel may cache attributes */
	double entry_timeout; /* seconds it may cache a name */
	double negative_timeout; /* seconds it may cache "no such name" */
	/* seconds it may cache attributes this mount holds under a lease (0: off) */
	double leased_attr_timeout;
	uint64_t readahead; /* bytes of kernel readahead per file */
	unsigned max_threads; /* request threads at most */
	uint32_t timeout_ms; /* retry an unreachable cluster this long, then EIO; 0 = default */
	int writeback; /* kernel write-back cache */
	int allow_other; /* users other than the mounter may enter */
	int kernel_perms; /* -o default_permissions even where mount.c would leave it out */
	int uring; /* -o uring: requests through io_uring queues per CPU (uring.c) */
	int ro; /* read-only mount */
	int nonempty; /* allow mounting over a non-empty folder */
	int noatime; /* reads never move atime (default: relatime) */
	int writebehind; /* creates and unlinks in delegated folders answered here (default on) */
	int flush; /* -o flush: every close sends FLUSH (default: not read-only ones, see noflush) */
	int foreground; /* -f: no fork, log to stderr */
	int debug; /* libfuse prints every request (with -f) */
	char log[PATH_MAX]; /* daemon log file; "" = the runtime folder's */
	char key_file[PATH_MAX]; /* -o key=FILE (absolute): a cluster or client key; "" = default */
};

void stk_fuse_opts_default(struct stk_fuse_opts *o);

/* The POSIX lock owners a handle opened without FLUSH has locked through (locks.c). */
#define STK_FUSE_NOFLUSH_OWNERS 8

/*
 * One open file (fi->fh). Created by open/create, freed by release; the kernel
 * sends nothing on a handle after its release. All fields but atime_due and the
 * noflush owners are fixed at open.
 */
struct stk_fuse_fh {
	struct stk_fuse_node *node; /* the inode's table entry, alive while we are */
	struct stk_fuse_fh *next; /* in node->handles (table lock) */
	stk_file *priv; /* a read-only handle of our own, when not using node->wf */
	int writable;
	int uses_wf; /* holds a reference on node->wf */
	uint64_t flock_owner; /* owner of this open's flock locks: unique in this mount's life */
	uint64_t seen_wgen; /* node->wgen as priv's read size last followed it */
	_Atomic int atime_due; /* relatime: the first read records itself in meta, then 0 */
	int noflush; /* opened with FOPEN_NOFLUSH: its closes send no FLUSH (ops.c, open_fh) */
	/* Under locks.c's lock: who took POSIX locks through it, released at its release. */
	uint64_t nf_owner[STK_FUSE_NOFLUSH_OWNERS];
	unsigned nf_n;
};

/*
 * One inode in the table. ino, next, nopen, handles, seen, mtime, size, orphan
 * and attr are protected by the table lock; wf and wf_refs by the node's own
 * lock (taken after the table lock, never before it); the three counters are
 * atomic. A node lives while nopen > 0, so a handle may use its node unlocked.
 */
struct stk_fuse_node {
	uint64_t ino;
	struct stk_fuse_node *next; /* hash chain */
	unsigned nopen; /* handles open */
	struct stk_fuse_fh *handles;
	int seen; /* mtime and size below are from the last open */
	int64_t mtime_sec;
	uint32_t mtime_nsec;
	uint64_t size;
	int orphan; /* unlinked while open: attr is all that is left of it */
	struct stk_ll_attr attr;
	pthread_mutex_t lock;
	stk_file *wf; /* the shared read-write handle while a writable handle is open */
	unsigned wf_refs; /* handles, and reads in progress, using wf */
	_Atomic uint64_t wsize; /* the file size as writes through wf left it */
	_Atomic uint64_t wgen; /* bumped by every change made through wf */
	_Atomic uint64_t synced; /* wgen as of the last successful fsync of wf */
	/*
	 * The kernel asks for security.capability before every write (to clear it): the
	 * file has none until this stk_now_ns, as learnt from meta or from its create
	 * here (at most attr_timeout ago). xattr_gen: bumped by this mount's setxattr
	 * and removexattr, under lock with nocap_until.
	 */
	uint64_t nocap_until;
	uint64_t xattr_gen;
	_Atomic int posix_locked; /* a POSIX lock was taken through this mount: flushes unlock */
	/* Created here in a delegated folder (batched names, stoker_ll.h): its first write sends
	 * the queue first, so that no byte reaches storage before meta has the file. */
	_Atomic int behind;
};

struct stk_fuse_table {
	pthread_mutex_t lock;
	struct stk_fuse_node **buckets;
	size_t nbuckets;
	size_t count; /* nodes, open or remembered */
};

int stk_fuse_table_init(struct stk_fuse_table *t);
/* Frees every node; the handles must have been closed (stk_fuse_table_drain). */
void stk_fuse_table_destroy(struct stk_fuse_table *t);
/*
 * Enters a new handle on inode a->ino, whose attributes a were just fetched
 * (fh->writable set). Sets *keep_cache when the kernel's cached pages are still
 * right: the file's mtime and size are what they were at its previous open in
 * this mount, or this mount is writing it (the kernel's cache then holds what
 * meta does not know yet). 0 or -ENOMEM.
 */
int stk_fuse_table_open(struct stk_fuse_table *t, struct stk_fuse_fh *fh, const struct stk_ll_attr *a,
			int trunc, int *keep_cache);
/*
 * Removes a handle (its libstoker handles already closed). Returns 1 with
 * *orphan filled when it was the last handle on a file unlinked while open: the
 * caller then removes the file's data.
 */
int stk_fuse_table_release(struct stk_fuse_table *t, struct stk_fuse_fh *fh,
			   struct stk_ll_attr *orphan);
/* Whether any handle of Stoker inode ino is open through this mount. */
int stk_fuse_table_is_open(struct stk_fuse_table *t, uint64_t ino);
/*
 * Pins the node of inode ino, if this mount has it open, so that it stays while
 * the caller uses its shared handle without a file handle of its own (truncate
 * by name). NULL if the inode is not open here. stk_fuse_table_unpin drops the
 * pin (removing an orphan's data if the pin was the last to hold it).
 */
struct stk_fuse_node *stk_fuse_table_pin(struct stk_fuse_table *t, uint64_t ino);
void stk_fuse_table_unpin(struct stk_fuse_table *t, struct stk_fuse_node *n, stk_client *c);
/*
 * Overlays what this mount knows and meta does not yet: the size that writes not
 * yet fsynced reached.
 */
void stk_fuse_table_overlay(struct stk_fuse_table *t, struct stk_ll_attr *a);
/*
 * A file's last link went (a is its inode with nlink 0). If it is open in this
 * mount, it becomes an orphan and 0 is returned: its data goes at the last
 * close. Otherwise -ENOENT: the caller removes the data now.
 */
int stk_fuse_table_orphan(struct stk_fuse_table *t, const struct stk_ll_attr *a);
/* The attributes of an orphan, for getattr on its open handles. 0 or -ENOENT. */
int stk_fuse_table_orphan_attr(struct stk_fuse_table *t, uint64_t ino, struct stk_ll_attr *a);
/*
 * At unmount: closes every handle the kernel did not release (flushing what
 * they buffered) and removes the data of orphans. Returns the count closed.
 * No request may run any more.
 */
unsigned stk_fuse_table_drain(struct stk_fuse_table *t, stk_client *c);

/*
 * Why a cache of attributes (attrcache.c): the kernel forgets a folder's
 * attributes whenever an entry in it changes, and default_permissions then asks
 * for them again (a META_GETATTR) before the next create or unlink in it may go
 * ahead; and an open that may not keep the kernel's view of a file drops it, so
 * the first read asks again. Meta sends the folder's attributes with the reply
 * of the create or unlink, and the file's with the open, so such a getattr within
 * attr_timeout is answered here: what the kernel's own cache would have answered
 * had it not dropped them.
 */
#define STK_FUSE_ACACHE_SLOTS 64u

struct stk_fuse_acache_slot {
	struct stk_ll_attr a; /* a.ino 0: empty */
	uint64_t until_ns; /* answered until then (stk_now_ns) */
	uint64_t gen; /* bumped whenever the slot is dropped or cleared */
	uint64_t files_gen; /* a once-entry: the cache's files_gen at the put */
	int once; /* a file's, answered once */
};

/*
 * What the mount last told the kernel of a file (lookup, getattr, readdirplus),
 * kept only while every answer since agreed: an open that finds meta's fresh
 * attributes equal to these leaves the kernel's copy alone instead of dropping it
 * (which costs the first read a getattr). Direct-mapped; ino 0: empty.
 */
#define STK_FUSE_TOLD_SLOTS 1024u

struct stk_fuse_told {
	uint64_t ino, size, files_gen;
	int64_t mtime_sec, ctime_sec;
	uint32_t mtime_nsec, ctime_nsec;
};

struct stk_fuse_acache {
	pthread_mutex_t lock;
	uint64_t ttl_ns; /* attr_timeout; 0 = the cache is off */
	uint64_t files_gen; /* bumped by stk_fuse_acache_forget_files */
	uint64_t any_gen; /* bumped by every drop, forget and clear */
	struct stk_fuse_acache_slot slot[STK_FUSE_ACACHE_SLOTS];
	struct stk_fuse_told *told; /* STK_FUSE_TOLD_SLOTS, or NULL: not kept */
};

/* Read before the call whose reply is put: a put after a change since is dropped. */
struct stk_fuse_acache_tok {
	uint64_t gen, files_gen, any_gen;
};

void stk_fuse_acache_init(struct stk_fuse_acache *d, double ttl_s);
void stk_fuse_acache_destroy(struct stk_fuse_acache *d);
struct stk_fuse_acache_tok stk_fuse_acache_begin(struct stk_fuse_acache *d, uint64_t ino);
/* Keeps folder a's attributes (sent with a create or an unlink in it). */
void stk_fuse_acache_put_dir(struct stk_fuse_acache *d, const struct stk_ll_attr *a,
			     struct stk_fuse_acache_tok t);
/* Keeps file a's attributes (fetched by an open) for one getattr. */
void stk_fuse_acache_put_once(struct stk_fuse_acache *d, const struct stk_ll_attr *a,
			      struct stk_fuse_acache_tok t);
/* Inode ino's attributes if kept and not older than attr_timeout: 0, else -ENOENT. */
int stk_fuse_acache_get(struct stk_fuse_acache *d, uint64_t ino, struct stk_ll_attr *a);
/*
 * Notes file a's attributes as told to the kernel by a reply to a call that began
 * at t (any change by this mount since then, or a different answer since the last
 * one, and nothing is kept for it).
 */
void stk_fuse_acache_told(struct stk_fuse_acache *d, const struct stk_ll_attr *a,
			  struct stk_fuse_acache_tok t);
/* 1 if the kernel was told exactly a's size, mtime and ctime for a->ino; else 0. */
int stk_fuse_acache_told_same(struct stk_fuse_acache *d, const struct stk_ll_attr *a);
/* Forgets inode ino: this mount may have changed its attributes. */
void stk_fuse_acache_drop(struct stk_fuse_acache *d, uint64_t ino);
/* Forgets every file (an unlink changed some file's link count). */
void stk_fuse_acache_forget_files(struct stk_fuse_acache *d);
/* Forgets everything: this mount changed folders in a way the cache does not follow. */
void stk_fuse_acache_clear(struct stk_fuse_acache *d);

/*
 * Names whose lease meta revoked, for the kernel to look up again (notify.c): a
 * ring of STK_FUSE_NOTIFY_Q filled by the lookup cache's watch thread and emptied
 * by a thread of its own. All fields under mu but thr and running (start and stop
 * only).
 */
#define STK_FUSE_NOTIFY_Q 256u

struct stk_fuse_notify {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t thr;
	int running, stop;
	unsigned head, count;
	struct {
		uint64_t parent; /* Stoker inode of the folder */
		char name[64];	 /* the lookup cache keeps shorter names only */
	} q[STK_FUSE_NOTIFY_Q];
};

/* The mount: the session's userdata. */
struct stk_fuse {
	stk_client *c;
	struct fuse_session *se;
	uint64_t root_ino; /* the Stoker inode mounted as FUSE_ROOT_ID */
	struct stk_fuse_opts o;
	struct stk_fuse_table tab;
	struct stk_fuse_acache acache;
	pthread_key_t rbuf_key; /* per-thread read buffer of STK_FUSE_IO_MAX bytes */
	int rbuf_key_ok;
	struct stk_fuse_uring *uring; /* -o uring, once set up; else NULL */
	int no_getattrs; /* atomic: meta answered META_GETATTRS with ENOSYS */
	int no_lookups;	 /* atomic: meta answered META_LOOKUPS with ENOSYS */
	_Atomic int posix_seen; /* a POSIX lock was asked for through this mount: opens flush */
	struct stk_fuse_notify notify;
};

/*
 * notify.c. start: once the lookup cache runs and the session serves (init); 0 or
 * -EAGAIN (no thread: stale names are still answered ESTALE). stop: before the
 * session goes; waits for the thread.
 */
int stk_fuse_notify_start(struct stk_fuse *fs);
void stk_fuse_notify_stop(struct stk_fuse *fs);

/*
 * FUSE over io_uring (uring.c). setup: after the session is mounted and before
 * its loop; takes the session's /dev/fuse reads and writes (0, -ENOMEM, -EIO).
 * start: from the init callback; its threads register once INIT is answered.
 * stop: after the loop ended; joins and frees. Any failure leaves /dev/fuse
 * serving every request, as without the option.
 */
int stk_fuse_uring_setup(struct stk_fuse *fs);
int stk_fuse_uring_start(struct stk_fuse *fs);
void stk_fuse_uring_stop(struct stk_fuse *fs);
/*
 * On a ring thread serving a request without a payload (a read): a buffer of len
 * bytes that is the entry's own payload buffer, so a reply made from it is not
 * copied again. NULL elsewhere, or if len is larger. Valid until the reply.
 */
void *stk_fuse_uring_buf(size_t len);
/* On a ring thread: on 1, lets it run on any CPU; on 0, pins it to its queue's again. */
void stk_fuse_uring_roam(int on);
/* Once the daemon logs to its file: "io_uring: serving ..." is said there (once). */
void stk_fuse_uring_announce(struct stk_fuse *fs);

/* Sets up fs->tab and the per-thread buffers. 0 or -errno. */
int stk_fuse_fs_init(struct stk_fuse *fs);
/* Closes what is left open and frees what stk_fuse_fs_init made. */
void stk_fuse_fs_fini(struct stk_fuse *fs);
/* The operations table for fuse_session_new. */
const struct fuse_lowlevel_ops *stk_fuse_ops(void);

/*
 * Locks (locks.c): the getlk, setlk and flock callbacks, and the hooks flush
 * (POSIX locks of fi->lock_owner go) and release (the flock lock goes when
 * fi->flock_release) call before they free anything. Each callback replies.
 */
void stk_fuse_getlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lock);
void stk_fuse_setlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lock,
		    int sleep);
void stk_fuse_flock(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, int op);
void stk_fuse_locks_flush(struct stk_fuse *fs, struct fuse_file_info *fi);
void stk_fuse_locks_release(struct stk_fuse *fs, struct fuse_file_info *fi);

#endif
