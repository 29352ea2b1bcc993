/*
 * stoker-nfs-fsid.so: loaded into ganesha.nfsd by `stoker gateway nfs`
 * (LD_PRELOAD), so that the Stoker mount it exports keeps one file system id.
 *
 * Why: Ganesha's VFS FSAL writes the exported file system's id into every NFS
 * file handle and finds the file system by that id when a handle comes back.
 * It takes the id from statfs's f_fsid and, where that is 0 (the kernel's FUSE
 * never fills it), from the mount's device number, which the kernel hands out
 * afresh at every mount (an anonymous device). A gateway that is restarted
 * mounts again, gets another device number, and every handle its clients hold
 * would be stale although the files are the same: the rest of the handle is the
 * Stoker inode number (docs/nfs-smb.md, "File handles").
 *
 * So statfs and statfs64 of exactly the path in STOKER_NFS_FSID_PATH answer with
 * f_fsid set to STOKER_NFS_FSID ("MAJOR.MINOR", two 32-bit numbers the gateway
 * derives from the exported folder's inode); every other call passes through
 * untouched. Nothing here runs in Stoker's own processes.
 */
/* Both names below are defined here, each with its own struct: not one redirected
 * to the other, as _FILE_OFFSET_BITS=64 (the build's flag) would. */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>

#define STK_EXPORT __attribute__((visibility("default")))

typedef int (*statfs_fn)(const char *, struct statfs *);
typedef int (*statfs64_fn)(const char *, struct statfs64 *);

/* Parses "MAJOR.MINOR" (decimal, each below 2^32) into f; 0 on success. */
static int fsid_parse(const char *s, fsid_t *f)
{
	unsigned long long v[2];
	char *end;

	for (int i = 0; i < 2; i++) {
		errno = 0;
		v[i] = strtoull(s, &end, 10);
		if (errno || end == s || v[i] > UINT32_MAX || *end != (i ? '\0' : '.'))
			return -1;
		s = end + 1;
	}
	f->__val[0] = (int)(uint32_t)v[0];
	f->__val[1] = (int)(uint32_t)v[1];
	return 0;
}

/* Overlays the gateway's id on *out when path is its mount point. */
static void fsid_fix(const char *path, fsid_t *out)
{
	const char *want = getenv("STOKER_NFS_FSID_PATH");
	const char *id = getenv("STOKER_NFS_FSID");
	fsid_t f;

	if (want && id && path && strcmp(path, want) == 0 && fsid_parse(id, &f) == 0)
		*out = f;
}

STK_EXPORT int statfs(const char *path, struct statfs *st)
{
	static statfs_fn real;
	int rc;

	if (!real)
		real = (statfs_fn)dlsym(RTLD_NEXT, "statfs");
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	rc = real(path, st);
	if (rc == 0)
		fsid_fix(path, &st->f_fsid);
	return rc;
}

/* What programs built with _FILE_OFFSET_BITS=64 call. */
STK_EXPORT int statfs64(const char *path, struct statfs64 *st)
{
	static statfs64_fn real;
	int rc;

	if (!real)
		real = (statfs64_fn)dlsym(RTLD_NEXT, "statfs64");
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	rc = real(path, st);
	if (rc == 0)
		fsid_fix(path, &st->f_fsid);
	return rc;
}
