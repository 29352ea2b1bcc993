/*
 * Small helpers shared by every module: time, checked number parsing, byte sizes,
 * address parsing and CRC32C.
 */
#ifndef STK_UTIL_H
#define STK_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define STK_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define STK_MIN(a, b) ((a) < (b) ? (a) : (b))
#define STK_MAX(a, b) ((a) > (b) ? (a) : (b))
#define STK_DIV_ROUND_UP(a, b) (((a) + (b)-1) / (b))

/* Monotonic clock in nanoseconds. */
uint64_t stk_now_ns(void);
/* Wall clock, split into seconds and nanoseconds. */
void stk_wall_time(int64_t *sec, uint32_t *nsec);
/* Wall clock in milliseconds since the Unix epoch. */
uint64_t stk_wall_ms(void);

/* CRC32C (Castagnoli), computed with ISA-L. crc is the running value, 0 to start. */
uint32_t stk_crc32c(uint32_t crc, const void *buf, size_t len);

/*
 * CRC32C of each `block`-byte piece of buf (the last may be shorter) into out,
 * which holds (len + block - 1) / block values.
 */
void stk_crc32c_blocks(const void *buf, size_t len, size_t block, uint32_t *out);
/* A block for stk_crc32c_copy_blocks: its bytes are read at src and stored at dst. */
struct stk_crc_copy {
	void *dst;
	const void *src;
};
/*
 * Copies n blocks of `block` bytes (a multiple of 8), each from v[i].src to
 * v[i].dst (no two overlapping), and sets out[i] to the CRC32C of the bytes
 * stored at v[i].dst, read once from src: the checksum is of what was copied even
 * if src changes meanwhile. On x86-64 with SSE4.2 three blocks are hashed side by
 * side with the crc32 instruction as they are copied, so that for bytes that come
 * from memory the checksum costs little more than the copy; elsewhere each block
 * is copied, then hashed from the copy.
 */
void stk_crc32c_copy_blocks(const struct stk_crc_copy *v, size_t n, size_t block, uint32_t *out);
struct iovec;
/*
 * Steps past `done` bytes that a readv/writev-like call moved out of the *n entries
 * at *iov: entries it moved whole are dropped, one it moved in part is trimmed in
 * place (its base and length change). done must not exceed the entries' total.
 */
void stk_iov_advance(struct iovec **iov, int *n, size_t done);
/* Index of the first piece whose CRC32C differs from crcs, or -1 if all match. */
long stk_crc32c_blocks_check(const void *buf, size_t len, size_t block, const uint32_t *crcs);

/* Parses a decimal unsigned number; 0 or -EINVAL / -ERANGE. */
int stk_parse_u64(const char *s, uint64_t *out);
/* Parses "123", "4k", "1M", "2GiB" (binary units); 0 or -EINVAL. */
int stk_parse_size(const char *s, uint64_t *out);
/* Formats a byte count as "1.5 GiB" into buf. Returns buf. */
char *stk_format_size(uint64_t bytes, char *buf, size_t len);

/*
 * Splits "HOST:PORT" (HOST may be "[v6]") into host and port. host must hold
 * hostlen bytes. 0, or -EINVAL for a malformed address.
 */
int stk_parse_hostport(const char *addr, char *host, size_t hostlen, uint16_t *port);

/* Bounded string copy that always terminates; returns -ENAMETOOLONG if truncated. */
int stk_strlcpy(char *dst, const char *src, size_t size);

/* Writes all of buf to fd, retrying on EINTR and short writes. 0 or -errno. */
int stk_write_all(int fd, const void *buf, size_t len);
/* Reads exactly len bytes unless EOF comes first; returns bytes read or -errno. */
long stk_read_full(int fd, void *buf, size_t len);
/* pread/pwrite loops: all bytes or -errno; pread returns bytes read (short at EOF). */
long stk_pread_full(int fd, void *buf, size_t len, uint64_t off);
int stk_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);

/* mkdir -p; 0 or -errno. */
int stk_mkdir_p(const char *path, unsigned mode);

/* fsync of the folder holding path (after a rename or create in it). 0 or -errno. */
int stk_fsync_parent(const char *path);

/*
 * Replaces the file at path with buf atomically and durably: writes path.tmp,
 * fsyncs it, renames it over path and fsyncs the folder. On error the old file is
 * intact and the temporary file removed. 0 or -errno.
 */
int stk_write_file_atomic(const char *path, const void *buf, size_t len);

/*
 * A buffer for large direct reads: len bytes, page-aligned at lead; when what
 * follows lead is 256 KiB or more, the byte at lead is on a 2 MiB boundary and
 * what follows it is backed by transparent huge pages where the kernel gives them.
 * A direct read into ordinary memory is one segment per 4 KiB page, and a block
 * device takes only so many segments per request (254 on a virtio disk), so a
 * 1 MiB read there went as two requests; into a huge page it is one segment.
 * Without huge pages it is ordinary memory. The caller owns it until
 * stk_huge_free(p, len, lead) with the same len and lead (p NULL: nothing).
 * NULL when the memory cannot be mapped (out of memory); errno says why.
 */
void *stk_huge_alloc(size_t len, size_t lead);
void stk_huge_free(void *p, size_t len, size_t lead);

#endif
