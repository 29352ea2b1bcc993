/*
 * The lock table of a meta node: advisory locks on inodes, held by client
 * sessions, as flock(2) and fcntl(2) POSIX record locks define them.
 *
 * A lock is (session, owner, kind, type, [start, end]) on an inode. kind is
 * STK_LOCK_POSIX (byte ranges; end is inclusive, UINT64_MAX means "to the end of
 * the file, however it grows") or STK_LOCK_FLOCK (always the whole file). The
 * owner is what the client names as the holder: the lock owner id FUSE passes
 * (one per process for POSIX locks, one per open file description for flock).
 * Two locks conflict when they are of the same kind, have different holders
 * (session, owner), overlap, and at least one is a write lock. flock and POSIX
 * locks never conflict with each other, as on Linux.
 *
 * Setting follows POSIX: the holder's own locks in the range are replaced
 * (split where the new range cuts them, an unlock being a set to "no lock"),
 * and the result is merged with the holder's adjacent or overlapping locks of
 * the same type, so a holder never has two touching locks of one type.
 *
 * The table is plain data with no lock of its own: the caller (session.c)
 * serialises every call. Memory: one small allocation per lock held.
 */
#ifndef STK_META_LOCKS_H
#define STK_META_LOCKS_H

#include <stddef.h>
#include <stdint.h>

/* The same values as stoker.h gives them (identical definitions may repeat). */
#define STK_LOCK_POSIX 0
#define STK_LOCK_FLOCK 1

#define STK_LOCK_RD 1
#define STK_LOCK_WR 2
#define STK_LOCK_UN 3

#define STK_LOCK_EOF UINT64_MAX

struct stk_lock {
	uint64_t session;
	uint64_t owner;
	uint8_t kind; /* STK_LOCK_POSIX / STK_LOCK_FLOCK */
	uint8_t type; /* STK_LOCK_RD / WR (UN only in requests) */
	uint64_t start;
	uint64_t end; /* inclusive; STK_LOCK_EOF: to the end of the file */
	uint32_t pid; /* the holder's process id, as the client reports it (0 if unknown) */
};

struct stk_lock_table;

/* 0 or -ENOMEM. */
int stk_locktab_create(struct stk_lock_table **out);
void stk_locktab_destroy(struct stk_lock_table *t);

/*
 * The first lock on ino that conflicts with `want` (whose type is RD or WR):
 * returns 1 with *conflict filled, or 0 if want could be granted now.
 */
int stk_locktab_test(struct stk_lock_table *t, uint64_t ino, const struct stk_lock *want,
		  struct stk_lock *conflict);
/*
 * Sets (RD / WR) or removes (UN) want's range for its holder. -EAGAIN with
 * *conflict filled (conflict may be NULL) when another holder's lock is in the
 * way (nothing changes then); -EINVAL for a bad type, kind or range (start >
 * end); -ENOMEM. An unlock never fails but for -EINVAL.
 */
int stk_locktab_set(struct stk_lock_table *t, uint64_t ino, const struct stk_lock *want,
		 struct stk_lock *conflict);
/* Drops every lock the session holds, on every inode. Returns how many went. */
size_t stk_locktab_drop_session(struct stk_lock_table *t, uint64_t session);
/*
 * Copies up to max locks on ino into out, in (kind, start) order within a
 * holder; returns the total count on ino (for tests and `stoker status`).
 */
size_t stk_locktab_list(struct stk_lock_table *t, uint64_t ino, struct stk_lock *out, size_t max);

#endif
