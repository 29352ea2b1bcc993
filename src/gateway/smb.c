/*
 * `stoker gateway smb`: serves folders of the cluster as SMB2/SMB3 shares
 * through Samba's smbd, which does all the protocol work.
 *
 * smbd serves a private Stoker mount of the cluster's root (super.c); each
 * --share NAME=/DIR is a share on a folder of it. Access is Samba's own: users
 * with passwords in a passdb kept in the state folder (from --users, or added
 * later with `smbpasswd -c STATE/smb.conf -a NAME`), each mapped to the Unix
 * user of that name, whose uid and gid Stoker records and checks; no guests;
 * signing required; encryption desired (or required, or off). Permissions are
 * the POSIX mode bits every other protocol sees (no NT ACLs of their own, which
 * NFS, S3 and the mount would not see); DOS attributes and alternate data
 * streams are kept in extended attributes.
 *
 * As for NFS, everything wrong is found before anything starts, each with one
 * line: options, Samba missing, a share folder not in the cluster, a user with
 * no Unix account, a port in use.
 */
#include "super.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "../cli/cli.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../daemon/daemon.h"

#define SMB_SHARES_MAX 64
#define SMB_USERS_MAX 256
#define SMB_NAME_MAX 64 /* a share's or a user's name */
#define SMB_PASS_MAX 256
#define SMB_FILE_MAX (64u << 10) /* --users */

struct smb_share {
	char name[SMB_NAME_MAX + 1];
	const char *dir; /* in the cluster */
	int ro;
};

struct smb_user {
	char name[SMB_NAME_MAX + 1];
	char pass[SMB_PASS_MAX + 1];
};

static const struct option smb_opts[] = {
    {"cluster", required_argument, NULL, 'c'}, {"key-file", required_argument, NULL, 'F'},
    {"share", required_argument, NULL, 'S'},   {"listen", required_argument, NULL, 'l'},
    {"users", required_argument, NULL, 'u'},   {"encrypt", required_argument, NULL, 'E'},
    {"state", required_argument, NULL, 's'},   {"metrics", required_argument, NULL, 'M'},
    {"smbd", required_argument, NULL, 'D'},    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Letters, digits, '_', '-', '.'; 1 to SMB_NAME_MAX bytes. */
static int name_ok(const char *s, size_t n)
{
	if (n == 0 || n > SMB_NAME_MAX || s[0] == '.' || s[0] == '-')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-' || s[i] == '.'))
			return 0;
	return 1;
}

/* NAME=/DIR or NAME=/DIR:ro. */
static int parse_share(const char *v, struct smb_share *sh)
{
	const char *eq = strchr(v, '=');
	size_t n, dl;
	char *dir;

	if (!eq || !name_ok(v, (size_t)(eq - v)))
		return -EINVAL;
	n = (size_t)(eq - v);
	memcpy(sh->name, v, n);
	sh->name[n] = 0;
	if (!strcasecmp(sh->name, "global") || !strcasecmp(sh->name, "homes") ||
	    !strcasecmp(sh->name, "printers") || !strcasecmp(sh->name, "ipc"))
		return -EINVAL;
	dir = strdup(eq + 1);
	if (!dir)
		return -ENOMEM;
	dl = strlen(dir);
	sh->ro = 0;
	if (dl > 3 && strcmp(dir + dl - 3, ":ro") == 0) {
		dir[dl - 3] = 0;
		sh->ro = 1;
	} else if (dl > 3 && strcmp(dir + dl - 3, ":rw") == 0) {
		dir[dl - 3] = 0;
	}
	if (dir[0] != '/' || !stk_gw_conf_value_ok(dir, 1024) || strstr(dir, "/..")) {
		free(dir);
		return -EINVAL;
	}
	sh->dir = dir;
	return 0;
}

/* "NAME PASSWORD" per line (the password is the rest of the line); '#' comments. */
static int load_users(const char *cmd, const char *path, struct smb_user *u, unsigned *nu)
{
	char *buf = NULL, *p, *end;
	unsigned lineno = 0;
	struct stat st;
	FILE *f;
	size_t n;
	int rc = 0;

	f = fopen(path, "r");
	if (!f) {
		rc = -errno;
		cli_err(cmd, "--users %s: %s", path, stk_strerror(rc));
		return rc;
	}
	if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
		stk_warn("smb gateway: %s is readable by others; passwords belong in a 0600 file",
			 path);
	buf = malloc(SMB_FILE_MAX + 1);
	if (!buf) {
		fclose(f);
		return -ENOMEM;
	}
	n = fread(buf, 1, SMB_FILE_MAX + 1, f);
	fclose(f);
	if (n > SMB_FILE_MAX) {
		cli_err(cmd, "--users %s: larger than %u bytes", path, SMB_FILE_MAX);
		rc = -EFBIG;
		goto out;
	}
	buf[n] = 0;
	for (p = buf; *p && rc == 0; p = end) {
		char *name, *pass, *q;

		lineno++;
		end = strchr(p, '\n');
		if (end)
			*end++ = 0;
		else
			end = p + strlen(p);
		while (*p == ' ' || *p == '\t')
			p++;
		if (!*p || *p == '#' || *p == '\r')
			continue;
		name = p;
		while (*p && *p != ' ' && *p != '\t')
			p++;
		q = p;
		while (*p == ' ' || *p == '\t')
			p++;
		pass = p;
		*q = 0;
		p = pass + strlen(pass);
		while (p > pass && (p[-1] == '\r' || p[-1] == ' ' || p[-1] == '\t'))
			*--p = 0;
		if (!name_ok(name, strlen(name)) || !*pass || strlen(pass) > SMB_PASS_MAX ||
		    *nu == SMB_USERS_MAX) {
			cli_err(cmd, "--users %s:%u: expected \"NAME PASSWORD\"", path, lineno);
			rc = -EINVAL;
			break;
		}
		if (!getpwnam(name)) {
			cli_err(cmd,
				"--users %s:%u: %s is not a user of this machine (Samba maps each "
				"SMB user to the Unix user of the same name; add it with useradd)",
				path, lineno, name);
			rc = -ENOENT;
			break;
		}
		snprintf(u[*nu].name, sizeof(u[*nu].name), "%s", name);
		snprintf(u[*nu].pass, sizeof(u[*nu].pass), "%s", pass);
		(*nu)++;
	}
out:
	OPENSSL_cleanse(buf, n <= SMB_FILE_MAX ? n : SMB_FILE_MAX);
	free(buf);
	return rc;
}

static int write_conf(const struct stk_gw_super *s, const struct smb_share *sh, unsigned nsh,
		      const char *encrypt, char *path, size_t len)
{
	size_t cap = 8192 + (size_t)nsh * 2048, n = 0;
	char *buf = malloc(cap);
	int w, rc;

	if (!buf)
		return -ENOMEM;
	w = snprintf(buf, cap,
		     "# Written by `stoker gateway smb`; rewritten at every start.\n"
		     "[global]\n"
		     "\tserver role = standalone server\n"
		     "\tsmb ports = %u\n"
		     "\tinterfaces = %s\n"
		     "\tbind interfaces only = yes\n"
		     "\tdisable netbios = yes\n"
		     "\tpid directory = %s/smb/run\n"
		     "\tlock directory = %s/smb/lock\n"
		     "\tstate directory = %s/smb/state\n"
		     "\tcache directory = %s/smb/cache\n"
		     "\tprivate dir = %s/smb/private\n"
		     "\tncalrpc dir = %s/smb/ncalrpc\n"
		     "\tlog file = %s/smbd.log\n"
		     "\tmax log size = 10000\n"
		     "\tpassdb backend = tdbsam:%s/smb/private/passdb.tdb\n"
		     "\tserver min protocol = SMB2_02\n"
		     "\tserver signing = mandatory\n"
		     "\tsmb encrypt = %s\n"
		     "\tmap to guest = never\n"
		     "\trestrict anonymous = 2\n"
		     "\tload printers = no\n"
		     "\tprinting = bsd\n"
		     "\tprintcap name = /dev/null\n"
		     "\tdisable spoolss = yes\n"
		     "\tusershare max shares = 0\n"
		     /* permissions are the mode bits all protocols see, no NT ACLs of
		      * Samba's own; DOS attributes and streams live in xattrs */
		     "\tnt acl support = no\n"
		     "\tea support = yes\n"
		     "\tstore dos attributes = yes\n"
		     "\tmap archive = no\n"
		     "\tmap hidden = no\n"
		     "\tmap system = no\n"
		     "\tmap readonly = no\n"
		     "\tvfs objects = streams_xattr\n"
		     /* the mount gives Stoker's locks to every client; Samba's share
		      * modes and leases stay within this smbd (docs/nfs-smb.md) */
		     "\tkernel oplocks = no\n"
		     "\tkernel share modes = no\n"
		     "\tposix locking = yes\n",
		     s->port, s->host[0] ? s->host : "0.0.0.0", s->state, s->state, s->state, s->state,
		     s->state, s->state, s->state, s->state, encrypt);
	if (w < 0 || (size_t)w >= cap) {
		free(buf);
		return -E2BIG;
	}
	n = (size_t)w;
	for (unsigned i = 0; i < nsh; i++) {
		w = snprintf(buf + n, cap - n,
			     "[%s]\n"
			     "\tpath = %s%s\n"
			     "\tread only = %s\n"
			     "\tbrowseable = yes\n"
			     "\tguest ok = no\n",
			     sh[i].name, s->mnt, strcmp(sh[i].dir, "/") ? sh[i].dir : "",
			     sh[i].ro ? "yes" : "no");
		if (w < 0 || (size_t)w >= cap - n) {
			free(buf);
			return -E2BIG;
		}
		n += (size_t)w;
	}
	snprintf(path, len, "%s/smb.conf", s->state);
	rc = stk_write_file_atomic(path, buf, n);
	free(buf);
	return rc;
}

/* Sets user u's password in the passdb with `smbpasswd -c CONF -s -a NAME`. */
static int set_password(const char *conf, const struct smb_user *u)
{
	char *args[] = {"smbpasswd", "-c", (char *)conf, "-s", "-a", (char *)u->name, NULL};
	int p[2], st;
	pid_t pid;

	if (pipe(p))
		return -errno;
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -errno;
	}
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		dup2(p[0], 0);
		if (null >= 0)
			dup2(null, 1);
		close(p[0]);
		close(p[1]);
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		execvp(args[0], args);
		_exit(127);
	}
	close(p[0]);
	/* twice: the new password and its confirmation */
	for (int i = 0; i < 2; i++) {
		if (stk_write_all(p[1], u->pass, strlen(u->pass)) || stk_write_all(p[1], "\n", 1))
			break;
	}
	close(p[1]);
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

/*
 * 1 if every folder above state lets others through (o+x): smbd enters a share
 * as the client's user, so the mount below the state folder must be reachable by
 * every user. Else 0, with the folder that is not said.
 */
static int reachable_by_all(const char *cmd, const char *state)
{
	char p[PATH_MAX];
	struct stat st;

	snprintf(p, sizeof(p), "%s", state);
	for (char *slash = p + strlen(p); slash > p; slash = strrchr(p, '/')) {
		*slash = 0;
		if (stat(p[0] ? p : "/", &st) == 0 && !(st.st_mode & S_IXOTH)) {
			cli_err(cmd,
				"--state %s: %s is not searchable by other users, and smbd enters the "
				"shares below it as each client's user (chmod o+x %s, or another "
				"--state)",
				state, p[0] ? p : "/", p[0] ? p : "/");
			return 0;
		}
	}
	return 1;
}

int stk_gateway_smb(int argc, char **argv)
{
	const char *cmd = "gateway smb";
	struct stk_client_opts copts = {.size = sizeof(copts)};
	const char *cluster = NULL, *listen = "127.0.0.1:445", *state = NULL, *metrics = NULL;
	const char *users_path = NULL, *encrypt = "desired", *smbd = getenv("STOKER_SMBD");
	char state_buf[PATH_MAX], conf[PATH_MAX + 32], addr[STK_CLUSTER_ADDR_MAX + 1];
	char extra[128] = "", dirs[PATH_MAX + 32];
	static struct smb_share shares[SMB_SHARES_MAX];
	static struct smb_user users[SMB_USERS_MAX];
	unsigned nsh = 0, nu = 0;
	struct stk_gw_super s;
	stk_client *c = NULL;
	struct stat st;
	int ch, rc, ret = 1;

	memset(&s, 0, sizeof(s));
	s.lock_fd = -1;
	s.name = "smb";
	if (!smbd || !smbd[0])
		smbd = "/usr/sbin/smbd";
	optind = 1;
	while ((ch = getopt_long(argc, argv, "h", smb_opts, NULL)) != -1) {
		switch (ch) {
		case 'c':
			cluster = optarg;
			break;
		case 'F':
			copts.key_file = optarg;
			break;
		case 'S':
			if (nsh == SMB_SHARES_MAX) {
				cli_err(cmd, "--share: at most %u", SMB_SHARES_MAX);
				return 2;
			}
			if (parse_share(optarg, &shares[nsh])) {
				cli_err(cmd,
					"--share %s: expected NAME=/DIR[:ro] (NAME: letters, digits, "
					"'_', '-', '.'; not global, homes, printers or ipc)",
					optarg);
				return 2;
			}
			for (unsigned i = 0; i < nsh; i++)
				if (!strcasecmp(shares[i].name, shares[nsh].name)) {
					cli_err(cmd, "--share %s: a share of that name is given twice",
						shares[nsh].name);
					return 2;
				}
			nsh++;
			break;
		case 'l':
			listen = optarg;
			break;
		case 'u':
			users_path = optarg;
			break;
		case 'E':
			if (strcmp(optarg, "off") && strcmp(optarg, "desired") &&
			    strcmp(optarg, "required")) {
				cli_err(cmd, "--encrypt %s: expected off, desired or required", optarg);
				return 2;
			}
			encrypt = optarg;
			break;
		case 's':
			state = optarg;
			break;
		case 'M':
			metrics = optarg;
			break;
		case 'D':
			smbd = optarg;
			break;
		default:
			return cli_usage("gateway");
		}
	}
	if (optind != argc)
		return cli_usage("gateway");
	if (stk_parse_hostport(listen, s.host, sizeof(s.host), &s.port) || s.port == 0 ||
	    !stk_gw_conf_value_ok(s.host, 200)) {
		cli_err(cmd, "--listen %s: expected ADDR:PORT", listen);
		return 2;
	}
	if (nsh == 0 && parse_share("stoker=/", &shares[nsh++]))
		return 1;
	if (metrics && (!stk_gw_conf_value_ok(metrics, 100) || strchr(metrics, ','))) {
		cli_err(cmd, "--metrics %s: expected ADDR:PORT", metrics);
		return 2;
	}
	if (access(smbd, X_OK) != 0) {
		cli_err(cmd, "Samba is not installed (%s: %s); on Debian: apt-get install samba",
			smbd, strerror(errno));
		return 1;
	}
	if (users_path && load_users(cmd, users_path, users, &nu))
		goto out;
	if (!realpath("/proc/self/exe", s.exe)) {
		cli_err(cmd, "/proc/self/exe: %s", strerror(errno));
		goto out;
	}

	stk_daemon_init("smb");
	rc = stk_connect(cluster, &copts, &c);
	if (rc) {
		cli_err(cmd, "cluster %s: %s", cluster ? cluster : "(default)", stk_strerror(rc));
		goto out;
	}
	for (unsigned i = 0; i < nsh; i++) {
		rc = stk_stat(c, shares[i].dir, &st);
		if (!rc && !S_ISDIR(st.st_mode))
			rc = -ENOTDIR;
		if (rc) {
			cli_err(cmd, "--share %s=%s: %s in the cluster at %s", shares[i].name,
				shares[i].dir, stk_strerror(rc), stk_cluster_addr(c));
			goto out;
		}
	}
	snprintf(addr, sizeof(addr), "%s", stk_cluster_addr(c));
	stk_disconnect(c);
	c = NULL;
	rc = stk_gw_port_free(s.host, s.port);
	if (rc) {
		cli_err(cmd, "--listen %s: %s", listen,
			rc == -EADDRINUSE ? "port in use" : stk_strerror(rc));
		goto out;
	}
	if (!state) {
		char run[PATH_MAX - 32];

		cli_runtime_dir(run, sizeof(run));
		snprintf(state_buf, sizeof(state_buf), "%s/smb-%u", run, s.port);
		state = state_buf;
	}
	if (stk_gw_state_open(&s, cmd, state))
		goto out;
	if (!reachable_by_all(cmd, s.state))
		goto out;
	static const char *const sub[] = {"run", "lock", "state", "cache", "private", "ncalrpc"};
	for (size_t i = 0; i < sizeof(sub) / sizeof(sub[0]); i++) {
		snprintf(dirs, sizeof(dirs), "%s/smb/%s", s.state, sub[i]);
		rc = stk_mkdir_p(dirs, 0700);
		if (rc) {
			cli_err(cmd, "%s: %s", dirs, stk_strerror(rc));
			goto out;
		}
	}
	rc = write_conf(&s, shares, nsh, encrypt, conf, sizeof(conf));
	if (rc) {
		cli_err(cmd, "%s: %s", conf, stk_strerror(rc));
		goto out;
	}
	for (unsigned i = 0; i < nu; i++) {
		if (set_password(conf, &users[i])) {
			cli_err(cmd, "could not set %s's password with smbpasswd", users[i].name);
			goto out;
		}
	}
	if (metrics)
		snprintf(extra, sizeof(extra), "metrics=%s", metrics);
	if (stk_gw_mount(&s, addr, "/", extra)) {
		cli_err(cmd, "could not mount the cluster on %s (see %s/mount.log)", s.mnt, s.state);
		goto out;
	}
	snprintf(s.server_log, sizeof(s.server_log), "%s/smbd.out", s.state);
	s.argv[0] = (char *)smbd;
	s.argv[1] = "--foreground";
	s.argv[2] = "--no-process-group";
	s.argv[3] = "-s";
	s.argv[4] = conf;
	rc = stk_gw_start(&s, 60000);
	if (rc) {
		cli_err(cmd, "smbd did not start (%s); its log: %s/smbd.log",
			rc == -ECHILD ? "it exited" : stk_strerror(rc), s.state);
		goto out;
	}
	for (unsigned i = 0; i < nsh; i++)
		stk_info("smb gateway: share %s: stk://%s%s%s", shares[i].name, addr, shares[i].dir,
			 shares[i].ro ? " (read-only)" : "");
	stk_info("smb gateway: serving %u share%s over SMB2/SMB3 on %s:%u, signing required, "
		 "encryption %s (state in %s)",
		 nsh, nsh == 1 ? "" : "s", s.host[0] ? s.host : "*", s.port, encrypt, s.state);
	if (metrics)
		stk_info("smb gateway: metrics on http://%s/metrics", metrics);
	stk_gw_supervise(&s);
	stk_info("smb gateway: stopping");
	ret = 0;
out:
	if (c)
		stk_disconnect(c);
	stk_gw_stop(&s);
	OPENSSL_cleanse(users, sizeof(users));
	for (unsigned i = 0; i < nsh; i++)
		free((char *)shares[i].dir);
	return ret;
}
