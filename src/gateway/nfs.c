/*
 * `stoker gateway nfs`: serves a folder of the cluster over NFSv3 and NFSv4.x
 * through NFS-Ganesha, which does all the protocol work.
 *
 * Ganesha's VFS FSAL serves a private Stoker mount (super.c) made with export
 * support: Ganesha's file handles are the kernel's FUSE handles, which are
 * Stoker inode numbers (stable, never reused), wrapped with a file system id
 * that stoker-nfs-fsid.so pins (preload/nfs_fsid.c). So a handle a client holds
 * stays valid across a restart of Ganesha or of the whole gateway. Debian ships
 * no FSAL SDK (no nfs-ganesha-dev), which rules out an FSAL over libstoker;
 * docs/nfs-smb.md has the whole argument.
 *
 * Everything wrong with the command line is found before anything starts, each
 * with one line: options, Ganesha or its VFS FSAL missing, NFSv3 asked for
 * without rpcbind, the folder not in the cluster, a port in use.
 */
#include "super.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../cli/cli.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../daemon/daemon.h"

#define NFS_ANON_ID 65534u /* nobody, nogroup: who a squashed root becomes */
#define NFS_CLIENTS_MAX 1024 /* bytes of --clients */

/* Where Debian, and other distributions, put Ganesha's FSAL plugins. */
static const char *const fsal_dirs[] = {
    "/usr/lib/x86_64-linux-gnu/ganesha", "/usr/lib/aarch64-linux-gnu/ganesha",
    "/usr/lib64/ganesha", "/usr/lib/ganesha", NULL};

static const struct option nfs_opts[] = {
    {"cluster", required_argument, NULL, 'c'},   {"key-file", required_argument, NULL, 'F'},
    {"export", required_argument, NULL, 'e'},    {"listen", required_argument, NULL, 'l'},
    {"mount-port", required_argument, NULL, 'p'}, {"protocols", required_argument, NULL, 'P'},
    {"clients", required_argument, NULL, 'C'},   {"ro", no_argument, NULL, 'r'},
    {"no-root-squash", no_argument, NULL, 'n'},  {"all-squash", no_argument, NULL, 'a'},
    {"anon-uid", required_argument, NULL, 'u'},  {"anon-gid", required_argument, NULL, 'g'},
    {"state", required_argument, NULL, 's'},     {"metrics", required_argument, NULL, 'M'},
    {"ganesha", required_argument, NULL, 'G'},   {"grace", required_argument, NULL, 'R'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

struct nfs_cfg {
	const char *export; /* folder of the cluster */
	char host[256];
	uint16_t port, mnt_port;
	int v3, v4;
	const char *clients; /* NULL: any address that reaches --listen */
	int ro;
	const char *squash; /* Ganesha's Squash value */
	uint32_t anon_uid, anon_gid;
	uint64_t root_ino; /* the exported folder's inode: its file system id */
	unsigned grace; /* seconds NFSv4 clients may reclaim after a restart; 0: none */
};

/* 1 if rpcbind answers on its local socket (Ganesha registers NFSv3 there). */
static int rpcbind_runs(void)
{
	static const char *const socks[] = {"/run/rpcbind.sock", "/var/run/rpcbind.sock", NULL};

	for (int i = 0; socks[i]; i++) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;

		if (fd < 0)
			return 0;
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socks[i]);
		ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		close(fd);
		if (ok)
			return 1;
	}
	return 0;
}

/* "3", "4", "3,4" (either order). */
static int parse_protocols(const char *v, int *v3, int *v4)
{
	*v3 = *v4 = 0;
	for (const char *p = v; *p; p++) {
		if (*p == '3')
			*v3 = 1;
		else if (*p == '4')
			*v4 = 1;
		else if (*p != ',')
			return -EINVAL;
	}
	return *v3 || *v4 ? 0 : -EINVAL;
}

/* Addresses, networks (CIDR), host names and '*', comma-separated. */
static int clients_ok(const char *v)
{
	size_t n = strlen(v);

	if (n == 0 || n > NFS_CLIENTS_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char ch = v[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || strchr(".:/*-_, ", ch)))
			return 0;
	}
	return 1;
}

static int parse_id(const char *cmd, const char *opt, const char *v, uint32_t *out)
{
	uint64_t x;

	if (stk_parse_u64(v, &x) || x > 0xfffffffeull) {
		cli_err(cmd, "--%s %s: expected a numeric id", opt, v);
		return -EINVAL;
	}
	*out = (uint32_t)x;
	return 0;
}

/* Ganesha's configuration for this gateway, written atomically to STATE/ganesha.conf. */
static int write_conf(const struct stk_gw_super *s, const struct nfs_cfg *g, char *path,
		      size_t len)
{
	char buf[8192], protos[8];
	const char *access = g->ro ? "RO" : "RW";
	int n;

	snprintf(protos, sizeof(protos), "%s%s%s", g->v3 ? "3" : "", g->v3 && g->v4 ? ", " : "",
		 g->v4 ? "4" : "");
	n = snprintf(buf, sizeof(buf),
		     "# Written by `stoker gateway nfs`; rewritten at every start.\n"
		     "NFS_CORE_PARAM {\n"
		     "\tBind_Addr = %s;\n"
		     "\tNFS_Port = %u;\n"
		     "\tMNT_Port = %u;\n"
		     "\tProtocols = %s;\n"
		     "\tEnable_NLM = false;\n"
		     "\tEnable_RQUOTA = false;\n"
		     "\tEnable_UDP = false;\n"
		     "\tMount_Path_Pseudo = true;\n"
		     "}\n"
		     "NFSV4 {\n"
		     "\tMinor_Versions = 0, 1, 2;\n"
		     /* a restarted server lets the NFSv4 clients it had (RecoveryRoot keeps
		      * who they were) reclaim their opens and locks before it takes new
		      * ones, for up to --grace seconds */
		     "\tGraceless = %s;\n"
		     "\tGrace_Period = %u;\n"
		     "\tLease_Lifetime = %u;\n"
		     /* owners as numbers, as Stoker and NFSv3 have them: no idmapd */
		     "\tAllow_Numeric_Owners = true;\n"
		     "\tOnly_Numeric_Owners = true;\n"
		     "\tRecoveryBackend = fs;\n"
		     "\tRecoveryRoot = %s/v4recov;\n"
		     "}\n"
		     "NFS_KRB5 { Active_krb5 = false; }\n"
		     /* Ganesha reads a folder a chunk at a time, each through a new
		      * descriptor that the mount walks to the chunk's start: fewer,
		      * larger chunks walk less */
		     "MDCACHE { Dir_Chunk = 4096; }\n"
		     "EXPORT {\n"
		     "\tExport_Id = 1;\n"
		     "\tPath = %s;\n"
		     "\tPseudo = %s;\n"
		     "\tProtocols = %s;\n"
		     "\tTransports = TCP;\n"
		     "\tSecType = sys;\n"
		     "\tAccess_Type = %s;\n"
		     "\tSquash = %s;\n"
		     "\tAnonymous_Uid = %u;\n"
		     "\tAnonymous_Gid = %u;\n"
		     "\tDisable_ACL = true;\n"
		     "\tAttr_Expiration_Time = 0;\n"
		     "%s%s%s%s%s"
		     "\tFSAL { Name = VFS; }\n"
		     "}\n",
		     g->host[0] ? g->host : "0.0.0.0", g->port, g->mnt_port, protos,
		     g->grace ? "false" : "true", g->grace ? g->grace : 60,
		     g->grace && g->grace < 15 ? g->grace : 15, s->state,
		     s->mnt, g->export, protos, g->clients ? "None" : access, g->squash, g->anon_uid,
		     g->anon_gid, g->clients ? "\tCLIENT {\n\t\tClients = " : "",
		     g->clients ? g->clients : "", g->clients ? ";\n\t\tAccess_Type = " : "",
		     g->clients ? access : "", g->clients ? ";\n\t}\n" : "");
	if (n < 0 || (size_t)n >= sizeof(buf))
		return -E2BIG;
	snprintf(path, len, "%s/ganesha.conf", s->state);
	return stk_write_file_atomic(path, buf, (size_t)n);
}

/* The FSAL VFS plugin's folder, or NULL when nfs-ganesha-vfs is not installed. */
static const char *fsal_vfs_dir(void)
{
	char p[PATH_MAX];

	for (int i = 0; fsal_dirs[i]; i++) {
		snprintf(p, sizeof(p), "%s/libfsalvfs.so", fsal_dirs[i]);
		if (access(p, R_OK) == 0)
			return fsal_dirs[i];
	}
	return NULL;
}

/* The preload library: $STOKER_NFS_FSID_LIB, beside this binary, or in ../lib/stoker. */
static int find_fsid_lib(const char *exe, char *out, size_t len)
{
	const char *env = getenv("STOKER_NFS_FSID_LIB");
	char dir[PATH_MAX];
	char *slash;

	if (env && env[0]) {
		snprintf(out, len, "%s", env);
		return access(out, R_OK) == 0 ? 0 : -ENOENT;
	}
	snprintf(dir, sizeof(dir), "%s", exe);
	slash = strrchr(dir, '/');
	if (!slash)
		return -ENOENT;
	*slash = 0;
	snprintf(out, len, "%s/stoker-nfs-fsid.so", dir);
	if (access(out, R_OK) == 0)
		return 0;
	snprintf(out, len, "%s/../lib/stoker/stoker-nfs-fsid.so", dir);
	return access(out, R_OK) == 0 ? 0 : -ENOENT;
}

int stk_gateway_nfs(int argc, char **argv)
{
	const char *cmd = "gateway nfs";
	struct stk_client_opts copts = {.size = sizeof(copts)};
	const char *cluster = NULL, *listen = "127.0.0.1:2049", *state = NULL, *metrics = NULL;
	const char *ganesha = getenv("STOKER_GANESHA"), *protocols = NULL;
	char state_buf[PATH_MAX], conf[PATH_MAX + 32], lib[PATH_MAX], preload[PATH_MAX + 16];
	char fsid_path[PATH_MAX + 32], fsid[48], addr[STK_CLUSTER_ADDR_MAX + 1];
	char pidfile[PATH_MAX + 32], logfile[PATH_MAX + 32], extra[128] = "";
	struct nfs_cfg g = {.export = "/", .squash = "Root_Squash", .anon_uid = NFS_ANON_ID,
			    .anon_gid = NFS_ANON_ID, .grace = 20};
	uint64_t grace;
	struct stk_gw_super s;
	uint64_t mnt_port = 0;
	stk_client *c = NULL;
	struct stat st;
	int ch, rc, ret = 1;

	memset(&s, 0, sizeof(s));
	s.lock_fd = -1;
	s.name = "nfs";
	if (!ganesha || !ganesha[0])
		ganesha = "/usr/bin/ganesha.nfsd";
	optind = 1;
	while ((ch = getopt_long(argc, argv, "h", nfs_opts, NULL)) != -1) {
		switch (ch) {
		case 'c':
			cluster = optarg;
			break;
		case 'F':
			copts.key_file = optarg;
			break;
		case 'e':
			g.export = optarg;
			break;
		case 'l':
			listen = optarg;
			break;
		case 'p':
			if (stk_parse_u64(optarg, &mnt_port) || mnt_port == 0 || mnt_port > 65535) {
				cli_err(cmd, "--mount-port %s: expected a port number", optarg);
				return 2;
			}
			break;
		case 'P':
			protocols = optarg;
			if (parse_protocols(optarg, &g.v3, &g.v4)) {
				cli_err(cmd, "--protocols %s: expected 3, 4 or 3,4", optarg);
				return 2;
			}
			break;
		case 'C':
			if (!clients_ok(optarg)) {
				cli_err(cmd,
					"--clients %s: expected addresses, networks (10.0.0.0/8), "
					"host names or *, separated by commas",
					optarg);
				return 2;
			}
			g.clients = optarg;
			break;
		case 'r':
			g.ro = 1;
			break;
		case 'n':
			g.squash = "No_Root_Squash";
			break;
		case 'a':
			g.squash = "All_Squash";
			break;
		case 'u':
			if (parse_id(cmd, "anon-uid", optarg, &g.anon_uid))
				return 2;
			break;
		case 'g':
			if (parse_id(cmd, "anon-gid", optarg, &g.anon_gid))
				return 2;
			break;
		case 's':
			state = optarg;
			break;
		case 'M':
			metrics = optarg;
			break;
		case 'G':
			ganesha = optarg;
			break;
		case 'R':
			if (stk_parse_u64(optarg, &grace) || grace > 600) {
				cli_err(cmd, "--grace %s: expected seconds from 0 to 600", optarg);
				return 2;
			}
			g.grace = (unsigned)grace;
			break;
		default:
			return cli_usage("gateway");
		}
	}
	if (optind != argc)
		return cli_usage("gateway");
	if (stk_parse_hostport(listen, g.host, sizeof(g.host), &g.port) || g.port == 0) {
		cli_err(cmd, "--listen %s: expected ADDR:PORT", listen);
		return 2;
	}
	if (g.export[0] != '/' || !stk_gw_conf_value_ok(g.export, 1024) || strstr(g.export, "/..")) {
		cli_err(cmd, "--export %s: expected an absolute path in the cluster", g.export);
		return 2;
	}
	if (metrics && (!stk_gw_conf_value_ok(metrics, 100) || strchr(metrics, ','))) {
		cli_err(cmd, "--metrics %s: expected ADDR:PORT", metrics);
		return 2;
	}
	if (access(ganesha, X_OK) != 0) {
		cli_err(cmd,
			"NFS-Ganesha is not installed (%s: %s); on Debian: apt-get install "
			"nfs-ganesha nfs-ganesha-vfs",
			ganesha, strerror(errno));
		return 1;
	}
	if (!fsal_vfs_dir()) {
		cli_err(cmd,
			"Ganesha's VFS FSAL (libfsalvfs.so) is not installed; on Debian: "
			"apt-get install nfs-ganesha-vfs");
		return 1;
	}
	/* NFSv3 needs rpcbind: Ganesha registers its v3 and MOUNT programs there and
	 * exits if it cannot. NFSv4 needs none. */
	if (!protocols) {
		g.v4 = 1;
		g.v3 = rpcbind_runs();
		if (!g.v3)
			stk_warn("nfs gateway: rpcbind is not running here: serving NFSv4 only "
				 "(start rpcbind for NFSv3)");
	} else if (g.v3 && !rpcbind_runs()) {
		cli_err(cmd,
			"NFSv3 needs rpcbind running on this host (Debian: apt-get install "
			"rpcbind; then start rpcbind), or serve NFSv4 alone with --protocols 4");
		return 1;
	}
	g.mnt_port = mnt_port ? (uint16_t)mnt_port : (uint16_t)(g.port + 1);
	if (!g.v3)
		g.mnt_port = g.port; /* unused without v3; Ganesha still wants a value */
	s.port = g.port;
	snprintf(s.host, sizeof(s.host), "%s", g.host);
	if (!realpath("/proc/self/exe", s.exe) || find_fsid_lib(s.exe, lib, sizeof(lib))) {
		cli_err(cmd, "stoker-nfs-fsid.so not found beside %s (set STOKER_NFS_FSID_LIB)",
			s.exe);
		return 1;
	}

	stk_daemon_init("nfs");
	rc = stk_connect(cluster, &copts, &c);
	if (rc) {
		cli_err(cmd, "cluster %s: %s", cluster ? cluster : "(default)", stk_strerror(rc));
		goto out;
	}
	rc = stk_stat(c, g.export, &st);
	if (!rc && !S_ISDIR(st.st_mode))
		rc = -ENOTDIR;
	if (rc) {
		cli_err(cmd, "--export %s: %s in the cluster at %s", g.export, stk_strerror(rc),
			stk_cluster_addr(c));
		goto out;
	}
	g.root_ino = (uint64_t)st.st_ino;
	snprintf(addr, sizeof(addr), "%s", stk_cluster_addr(c));
	stk_disconnect(c);
	c = NULL;

	rc = stk_gw_port_free(g.host, g.port);
	if (!rc && g.v3 && g.mnt_port != g.port)
		rc = stk_gw_port_free(g.host, g.mnt_port);
	if (rc) {
		cli_err(cmd, "--listen %s (NFS %u%s): %s", listen, g.port,
			g.v3 ? ", MOUNT --mount-port" : "",
			rc == -EADDRINUSE ? "port in use" : stk_strerror(rc));
		goto out;
	}
	if (!state) {
		char run[PATH_MAX - 32];

		cli_runtime_dir(run, sizeof(run));
		snprintf(state_buf, sizeof(state_buf), "%s/nfs-%u", run, g.port);
		state = state_buf;
	}
	if (stk_gw_state_open(&s, cmd, state))
		goto out;
	if (metrics)
		snprintf(extra, sizeof(extra), "metrics=%s", metrics);
	if (stk_gw_mount(&s, addr, g.export, extra)) {
		cli_err(cmd, "could not mount %s of the cluster on %s (see %s/mount.log)", g.export,
			s.mnt, s.state);
		goto out;
	}
	rc = write_conf(&s, &g, conf, sizeof(conf));
	if (rc) {
		cli_err(cmd, "%s: %s", conf, stk_strerror(rc));
		goto out;
	}
	snprintf(pidfile, sizeof(pidfile), "%s/ganesha.pid", s.state);
	snprintf(logfile, sizeof(logfile), "%s/ganesha.log", s.state);
	snprintf(s.server_log, sizeof(s.server_log), "%s/ganesha.out", s.state);
	snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", lib);
	snprintf(fsid_path, sizeof(fsid_path), "STOKER_NFS_FSID_PATH=%s", s.mnt);
	/* "STKR" and the folder's inode folded to 32 bits: unique among what one
	 * Ganesha sees (the root file system's id is a hash of its own). */
	snprintf(fsid, sizeof(fsid), "STOKER_NFS_FSID=%u.%u", 0x53544b52u,
		 (uint32_t)(g.root_ino ^ (g.root_ino >> 32)));
	s.envp[0] = preload;
	s.envp[1] = fsid_path;
	s.envp[2] = fsid;
	s.argv[0] = (char *)ganesha;
	s.argv[1] = "-F";
	s.argv[2] = "-f";
	s.argv[3] = conf;
	s.argv[4] = "-L";
	s.argv[5] = logfile;
	s.argv[6] = "-p";
	s.argv[7] = pidfile;
	s.argv[8] = "-N";
	s.argv[9] = "NIV_EVENT";
	rc = stk_gw_start(&s, 60000);
	if (rc) {
		cli_err(cmd, "ganesha.nfsd did not start (%s); its log: %s",
			rc == -ECHILD ? "it exited" : stk_strerror(rc), logfile);
		goto out;
	}
	stk_info("nfs gateway: serving stk://%s%s over NFS%s%s on %s:%u%s%s (state in %s)",
		 addr, g.export, g.v3 ? "v3 and " : "", g.v4 ? "v4.0-4.2" : "",
		 g.host[0] ? g.host : "*", g.port, g.ro ? ", read-only" : "",
		 strcmp(g.squash, "Root_Squash") ? "" : ", root squashed", s.state);
	if (metrics)
		stk_info("nfs gateway: metrics on http://%s/metrics", metrics);
	stk_gw_supervise(&s);
	stk_info("nfs gateway: stopping");
	ret = 0;
out:
	if (c)
		stk_disconnect(c);
	stk_gw_stop(&s);
	return ret;
}
