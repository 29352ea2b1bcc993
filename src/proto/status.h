/*
 * Wire status codes.
 *
 * Errors cross the wire as their own enum, never as a host's errno value, so that
 * two machines with different errno numbering (or a future non-Linux client) agree.
 * Each daemon translates -errno to a status when it replies, and each client
 * translates the status back to -errno when it reads the reply: the edge, and only
 * the edge, knows both.
 *
 * The table is declared once here; the enum and both translations come from it.
 */
#ifndef STK_PROTO_STATUS_H
#define STK_PROTO_STATUS_H

#include <errno.h>
#include <stdint.h>

/*       name               code  errno          */
#define STK_STATUS_TABLE(X)                          \
	X(OK, 0, 0)                                  \
	X(NOENT, 1, ENOENT)                          \
	X(EXIST, 2, EEXIST)                          \
	X(NOTDIR, 3, ENOTDIR)                        \
	X(ISDIR, 4, EISDIR)                          \
	X(NOTEMPTY, 5, ENOTEMPTY)                    \
	X(INVAL, 6, EINVAL)                          \
	X(NOSPC, 7, ENOSPC)                          \
	X(IO, 8, EIO)                                \
	X(ACCES, 9, EACCES)                          \
	X(PERM, 10, EPERM)                           \
	X(NAMETOOLONG, 11, ENAMETOOLONG)             \
	X(NOTSUP, 12, EOPNOTSUPP)                    \
	X(BADMSG, 13, EBADMSG)                       \
	X(LOOP, 14, ELOOP)                           \
	X(XDEV, 15, EXDEV)                           \
	X(FBIG, 16, EFBIG)                           \
	X(BUSY, 17, EBUSY)                           \
	X(AGAIN, 18, EAGAIN)                         \
	X(NODATA, 19, ENODATA)                       \
	X(RANGE, 20, ERANGE)                         \
	X(NOMEM, 21, ENOMEM)                         \
	X(MLINK, 22, EMLINK)                         \
	X(STALE_ROUTING, 23, ESTALE)                 \
	X(NOTCONN, 24, ENOTCONN)                     \
	X(TIMEDOUT, 25, ETIMEDOUT)                   \
	X(OVERFLOW, 26, EOVERFLOW)                   \
	X(NOSYS, 27, ENOSYS)                         \
	X(ROFS, 28, EROFS)                           \
	X(DQUOT, 29, EDQUOT)                         \
	X(BADF, 30, EBADF)                           \
	X(TOOBIG, 31, E2BIG)                         \
	X(CHUNK_BEHIND, 33, EUCLEAN)                 \
	X(CHUNK_PENDING, 34, EINPROGRESS)            \
	X(NOT_LEADER, 35, EREMCHG)                   \
	X(AUTH, 36, EKEYREJECTED)                    \
	X(CHUNK_DAMAGED, 37, EILSEQ)                 \
	X(TLS_REQUIRED, 38, EPROTONOSUPPORT)

enum stk_status {
#define STK_STATUS_ENUM(name, code, err) STK_ST_##name = code,
	STK_STATUS_TABLE(STK_STATUS_ENUM)
#undef STK_STATUS_ENUM
};

/* -errno (or 0) to a wire status. Unknown errnos become STK_ST_IO. */
uint32_t stk_status_from_errno(int neg_errno);
/* Wire status to -errno (or 0). Unknown statuses become -EIO. */
int stk_status_to_errno(uint32_t status);
/* "NOENT", "STALE_ROUTING", ... or "UNKNOWN". */
const char *stk_status_name(uint32_t status);

#endif
