/*
 * `stoker admin`: cluster administration. `admin init --key FILE` makes a cluster
 * key (docs/security.md): 32 random bytes as hex, mode 0600, never over an existing
 * file. Give it to every daemon with --key-file FILE and to clients with
 * --key-file / $STOKER_KEY_FILE (`stoker up` makes DATA/cluster.key itself).
 * `admin remove-node ID` gives up on an offline storage node now: mgmtd replaces
 * each of its targets in its chain (docs/architecture.md, "Replication").
 * `admin drain-node ID` moves an online node's chain memberships to other nodes
 * in the background, every chain keeping its copies throughout; `undrain-node ID`
 * cancels it. Once `stoker status` shows it with no membership left, remove-node
 * drops it though it runs. `admin accept-loss CHAIN` lets a chain whose every
 * copy was lost, and whose newest copy is gone for good, serve again from the
 * member that is back (changes only the lost ones held are given up).
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/auth.h"
#include "../common/util.h"
#include "../gateway/s3_parse.h"

/*
 * The arguments of an admin command on one id: ID [--cluster ADDR] [FLAG]. flag
 * (NULL for none) is an option without a value that sets *flag_set. 0, or the
 * exit code to return after saying what is wrong (what: the command; of: what the
 * id names, as `stoker status` shows it).
 */
static int id_args(int argc, char **argv, const char *what, const char *of,
		   const char **cluster, uint64_t *id, const char *flag, int *flag_set)
{
	int have = 0;

	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc) {
			*cluster = argv[++i];
		} else if (flag && strcmp(argv[i], flag) == 0) {
			*flag_set = 1;
		} else if (!have && stk_parse_u64(argv[i], id) == 0 && *id && *id <= UINT32_MAX) {
			have = 1;
		} else {
			cli_err("admin", "%s: unexpected argument '%s'", what, argv[i]);
			return cli_usage("admin");
		}
	}
	if (!have) {
		cli_err("admin", "%s needs %s", what, of);
		return cli_usage("admin");
	}
	return 0;
}

static int remove_node(int argc, char **argv)
{
	const char *cluster = NULL;
	uint64_t id = 0;
	uint32_t replaced = 0, kept = 0;
	int rc = id_args(argc, argv, "remove-node", "a storage node's id (`stoker status`, Nodes)",
			 &cluster, &id, NULL, NULL);

	if (rc)
		return rc;
	rc = stk_cluster_remove_node(cluster, (uint32_t)id, &replaced, &kept);
	if (rc == -ENOENT) {
		cli_err("admin", "remove-node: the cluster has no storage node %llu",
			(unsigned long long)id);
		return 1;
	}
	if (rc == -EBUSY) {
		cli_err("admin", "remove-node: node %llu is online: stop it first (its targets are "
				 "replaced only once it is gone), or drain it first (`stoker admin "
				 "drain-node %llu`) and wait until it holds no chain membership",
			(unsigned long long)id, (unsigned long long)id);
		return 1;
	}
	if (rc) {
		cli_err("admin", "remove-node: %s", stk_strerror(rc));
		return 1;
	}
	printf("node %llu: %u target(s) replaced in their chains (the new ones copy the chain's "
	       "chunks: `stoker status` shows them syncing)",
	       (unsigned long long)id, replaced);
	if (kept)
		printf("; %u kept: no free target of another failure domain, or no working "
		       "member to copy from",
		       kept);
	printf("\n");
	return kept ? 1 : 0;
}

/* Whether node id of the cluster is a meta node (by its status; 0 if not known). */
static int node_is_meta(const char *cluster, uint32_t id)
{
	const struct stk_cluster_node *n;
	stk_cluster_status *st;
	int meta = 0;

	if (stk_cluster_status_fetch(cluster, &st))
		return 0;
	for (uint32_t i = 0; (n = stk_cluster_status_node(st, i)); i++)
		if (n->id == id)
			meta = n->role == STK_CLUSTER_ROLE_META;
	stk_cluster_status_free(st);
	return meta;
}

/* `admin drain-node ID` (drain 1) and `admin undrain-node ID` (drain 0). */
static int drain_node(int argc, char **argv, int drain)
{
	const char *cluster = NULL, *what = drain ? "drain-node" : "undrain-node";
	uint64_t id = 0;
	uint32_t members = 0;
	int rc = id_args(argc, argv, what, "a storage or meta node's id (`stoker status`, Nodes)",
			 &cluster, &id, NULL, NULL);

	if (rc)
		return rc;
	rc = stk_cluster_drain_node(cluster, (uint32_t)id, drain, &members);
	if (rc == -ENOENT) {
		cli_err("admin", "%s: the cluster has no storage or meta node %llu", what,
			(unsigned long long)id);
		return 1;
	}
	if (rc == -EOPNOTSUPP) {
		cli_err("admin",
			"%s: meta node %llu is its shard's only copy (mgmtd --meta-replicas 1): "
			"nothing can take its place; run the cluster with --meta-replicas 2 or more "
			"and another meta node first",
			what, (unsigned long long)id);
		return 1;
	}
	if (rc) {
		cli_err("admin", "%s: %s", what, stk_strerror(rc));
		return 1;
	}
	if (node_is_meta(cluster, (uint32_t)id)) {
		if (!drain)
			printf("node %llu: no longer draining (meta node, %s)\n",
			       (unsigned long long)id,
			       members ? "it keeps its place in its shard" : "a spare");
		else if (members)
			printf("node %llu: draining: a spare meta node of its shard takes its place "
			       "once it has learned the shard (the leader copies the shard to it "
			       "beforehand, no write waiting; `stoker status` shows how far behind "
			       "it is under \"Metadata shards\"), then it leaves; then stop it\n",
			       (unsigned long long)id);
		else
			printf("node %llu: drained, holds no copy of its shard: stop it\n",
			       (unsigned long long)id);
		return 0;
	}
	if (!drain)
		printf("node %llu: no longer draining (%u chain membership(s); moves in flight "
		       "were abandoned)\n",
		       (unsigned long long)id, members);
	else if (members)
		printf("node %llu: draining, %u chain membership(s) left to move (`stoker status` "
		       "shows them go; then `stoker admin remove-node %llu`)\n",
		       (unsigned long long)id, members, (unsigned long long)id);
	else
		printf("node %llu: drained, no chain membership left: `stoker admin remove-node "
		       "%llu`, then stop it\n",
		       (unsigned long long)id, (unsigned long long)id);
	return 0;
}

/* `admin accept-loss CHAIN`: the chain serves again from the copy that is back. */
static int accept_loss(int argc, char **argv)
{
	const char *cluster = NULL;
	uint64_t id = 0;
	uint32_t kept = 0, dropped = 0, added = 0;
	int sure = 0;
	int rc = id_args(argc, argv, "accept-loss", "a chain's id (`stoker status`, Chains)",
			 &cluster, &id, "--yes-lose-data", &sure);

	if (rc)
		return rc;
	if (!sure) {
		cli_err("admin",
			"accept-loss gives up chain %llu's newest copy for good: changes only it "
			"held are lost, and the chunks it alone had read back as holes (zeros) "
			"or as they were before. Bring its node back if you can; if not, say "
			"--yes-lose-data",
			(unsigned long long)id);
		return 2;
	}
	rc = stk_cluster_accept_loss(cluster, (uint32_t)id, &kept, &dropped, &added);
	switch (rc) {
	case 0:
		break;
	case -ENOENT:
		cli_err("admin", "accept-loss: the cluster has no chain %llu", (unsigned long long)id);
		return 1;
	case -EINVAL:
		cli_err("admin", "accept-loss: chain %llu has one target: no other copy to serve "
				 "from",
			(unsigned long long)id);
		return 1;
	case -EBUSY:
		cli_err("admin", "accept-loss: chain %llu has a working member: nothing is lost",
			(unsigned long long)id);
		return 1;
	case -EAGAIN:
		cli_err("admin", "accept-loss: no member of chain %llu is back: start one of its "
				 "nodes, then ask again",
			(unsigned long long)id);
		return 1;
	default:
		cli_err("admin", "accept-loss: %s", stk_strerror(rc));
		return 1;
	}
	printf("chain %llu: target %u serves what it holds; %u member(s) gave up their copies "
	       "(changes only they held are gone), %u spare(s) joined to copy it\n",
	       (unsigned long long)id, kept, dropped, added);
	return 0;
}

/* ---- admin s3-user: the S3 gateway's users (docs/s3.md, "Users") ---- */

#define S3U_FILE_MAX (1u << 20)

/* The keys file's text ("" when it does not exist yet). 0 or -errno. */
static int s3u_read(const char *path, char **out)
{
	FILE *f = fopen(path, "r");
	char *buf = calloc(1, S3U_FILE_MAX + 1);
	size_t n;

	if (!buf) {
		if (f)
			fclose(f);
		return -ENOMEM;
	}
	*out = buf;
	if (!f)
		return errno == ENOENT ? 0 : -errno;
	n = fread(buf, 1, S3U_FILE_MAX + 1, f);
	fclose(f);
	if (n > S3U_FILE_MAX)
		return -EFBIG;
	buf[n] = 0;
	return 0;
}

/* Replaces path's content with text, mode 0600, through a rename. 0 or -errno. */
static int s3u_write(const char *path, const char *text)
{
	char tmp[4200];
	size_t n = strlen(text);
	int fd, rc = 0;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if ((rc = stk_write_all(fd, text, n)) == 0 && fsync(fd))
		rc = -errno;
	close(fd);
	if (rc == 0 && rename(tmp, path))
		rc = -errno;
	if (rc)
		unlink(tmp);
	return rc;
}

/*
 * n random characters of alphabet (an access key's id or secret), each drawn
 * evenly: bytes past the last whole multiple of its size are drawn again. 0 or -EIO.
 */
static int s3u_random(char *out, size_t n, const char *alphabet)
{
	unsigned na = (unsigned)strlen(alphabet), limit = 256 - 256 % na;
	uint8_t b[64];
	size_t i = 0;

	while (i < n) {
		if (stk_auth_random(b, sizeof(b)))
			return -EIO;
		for (size_t j = 0; j < sizeof(b) && i < n; j++)
			if (b[j] < limit)
				out[i++] = alphabet[b[j] % na];
	}
	out[n] = 0;
	OPENSSL_cleanse(b, sizeof(b));
	return 0;
}

/* A user's name: 1 to STK_S3_USER_MAX printable bytes, no space or '='. */
static int s3u_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || n > STK_S3_USER_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)name[i] <= ' ' || (unsigned char)name[i] >= 0x7f ||
		    name[i] == '=')
			return 0;
	return 1;
}

/*
 * `admin s3-user add NAME --keys FILE [--uid U --gid G] [--bucket B[:ro|:rw]]...`,
 * `admin s3-user rm NAME --keys FILE`, `admin s3-user ls --keys FILE`.
 */
static int s3_user(int argc, char **argv)
{
	const char *verb = argc > 2 ? argv[2] : "", *name = NULL, *path = NULL;
	struct stk_s3_keyline k;
	char *text = NULL, *out = NULL, line[4096];
	int have_uid = 0, have_gid = 0, rc, found = 0;
	size_t used = 0;

	memset(&k, 0, sizeof(k));
	for (int i = 3; i < argc; i++) {
		uint64_t v;

		if (strcmp(argv[i], "--keys") == 0 && i + 1 < argc) {
			path = argv[++i];
		} else if ((strcmp(argv[i], "--uid") == 0 || strcmp(argv[i], "--gid") == 0) &&
			   i + 1 < argc) {
			int uid = argv[i][2] == 'u';

			if (stk_parse_u64(argv[i + 1], &v) || v > UINT32_MAX) {
				cli_err("admin", "s3-user: bad %s '%s'", argv[i], argv[i + 1]);
				return 2;
			}
			*(uid ? &k.uid : &k.gid) = (uint32_t)v;
			*(uid ? &have_uid : &have_gid) = 1;
			i++;
		} else if (strcmp(argv[i], "--bucket") == 0 && i + 1 < argc) {
			const char *b = argv[++i], *colon = strchr(b, ':');
			size_t bl = colon ? (size_t)(colon - b) : strlen(b);
			struct stk_s3_user_bucket *ub = &k.buckets[k.nbuckets];

			if (k.nbuckets == STK_S3_USER_BUCKETS || bl > STK_S3_BUCKET_MAX ||
			    (colon && strcmp(colon, ":ro") != 0 && strcmp(colon, ":rw") != 0)) {
				cli_err("admin", "s3-user: bad --bucket '%s': NAME, NAME:rw or NAME:ro "
						 "(at most %d)",
					b, STK_S3_USER_BUCKETS);
				return 2;
			}
			memcpy(ub->name, b, bl);
			ub->name[bl] = 0;
			ub->rw = !colon || strcmp(colon, ":rw") == 0;
			if (strcmp(ub->name, "*") != 0 && stk_s3_bucket_check(ub->name)) {
				cli_err("admin", "s3-user: '%s' is not a bucket name (3 to 63 "
						 "lowercase letters, digits, '.' and '-'), nor *",
					ub->name);
				return 2;
			}
			k.nbuckets++;
		} else if (!name && argv[i][0] != '-') {
			name = argv[i];
		} else {
			cli_err("admin", "s3-user: unexpected argument '%s'", argv[i]);
			return cli_usage("admin");
		}
	}
	if (!path || (strcmp(verb, "ls") != 0 && !name) ||
	    (strcmp(verb, "add") != 0 && strcmp(verb, "rm") != 0 && strcmp(verb, "ls") != 0)) {
		cli_err("admin", "s3-user add NAME | rm NAME | ls, each with --keys FILE (the "
				 "gateway's --keys)");
		return cli_usage("admin");
	}
	if (name && !s3u_name_ok(name)) {
		cli_err("admin", "s3-user: bad user name '%s': 1 to %d printable characters, no "
				 "spaces or '='",
			name, STK_S3_USER_MAX);
		return 2;
	}
	if (have_uid != have_gid) {
		cli_err("admin", "s3-user: give --uid and --gid together (or neither: the user "
				 "acts as the gateway)");
		return 2;
	}
	rc = s3u_read(path, &text);
	if (rc == 0)
		out = malloc(strlen(text) + sizeof(line) + 2);
	if (rc == 0 && !out)
		rc = -ENOMEM;
	if (rc) {
		cli_err("admin", "s3-user: %s: %s", path, stk_strerror(rc));
		goto done;
	}
	if (strcmp(verb, "ls") == 0)
		printf("%-20s %-24s %-10s %-10s %s\n", "USER", "ACCESS KEY", "UID", "GID",
		       "BUCKETS");
	/* every line kept as it is, but the user's (rm) */
	for (char *p = text, *e; *p; p = e) {
		struct stk_s3_keyline cur;
		size_t n;

		e = strchr(p, '\n');
		n = e ? (size_t)(e - p) : strlen(p);
		e = e ? e + 1 : p + n;
		if (stk_s3_keyline_parse(p, n, &cur) == 0 && name && strcmp(cur.user, name) == 0) {
			found = 1;
			if (strcmp(verb, "rm") == 0)
				continue;
		}
		if (strcmp(verb, "ls") == 0 && stk_s3_keyline_parse(p, n, &cur) == 0) {
			char ids[2][16] = {"-", "-"}, bl[2048] = "";
			size_t o = 0;

			if (cur.has_ids) {
				snprintf(ids[0], sizeof(ids[0]), "%u", cur.uid);
				snprintf(ids[1], sizeof(ids[1]), "%u", cur.gid);
			}
			for (unsigned i = 0; i < cur.nbuckets && o < sizeof(bl) - 80; i++)
				o += (size_t)snprintf(bl + o, sizeof(bl) - o, "%s%s:%s", i ? "," : "",
						      cur.buckets[i].name,
						      cur.buckets[i].rw ? "rw" : "ro");
			printf("%-20s %-24s %-10s %-10s %s\n", cur.user[0] ? cur.user : "(gateway)",
			       cur.id, ids[0], ids[1],
			       cur.user[0] ? (cur.nbuckets ? bl : "(none)") : "(all)");
		}
		memcpy(out + used, p, (size_t)(e - p));
		used += (size_t)(e - p);
		if (used && out[used - 1] != '\n')
			out[used++] = '\n';
	}
	out[used] = 0;
	if (strcmp(verb, "ls") == 0)
		goto done;
	if (strcmp(verb, "rm") == 0 && !found) {
		cli_err("admin", "s3-user rm: %s has no user %s", path, name);
		rc = 1;
		goto done;
	}
	if (strcmp(verb, "add") == 0) {
		if (found) {
			cli_err("admin", "s3-user add: %s already has a user %s (rm it first)", path,
				name);
			rc = 1;
			goto done;
		}
		snprintf(k.user, sizeof(k.user), "%s", name);
		k.has_ids = have_uid ? 3 : 0;
		memcpy(k.id, "STK", 3);
		if (s3u_random(k.id + 3, 17, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") ||
		    s3u_random(k.secret, 40,
			       "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")) {
			cli_err("admin", "s3-user add: no random bytes");
			rc = 1;
			goto done;
		}
		rc = stk_s3_keyline_format(&k, line, sizeof(line));
		if (rc < 0) {
			cli_err("admin", "s3-user add: the line does not fit");
			rc = 1;
			goto done;
		}
		used += (size_t)snprintf(out + used, sizeof(line) + 2, "%s\n", line);
	}
	rc = s3u_write(path, out);
	if (rc) {
		cli_err("admin", "s3-user: cannot write %s: %s", path, stk_strerror(rc));
		rc = 1;
		goto done;
	}
	if (strcmp(verb, "add") == 0)
		printf("user %s: access key %s\nsecret key %s\n(in %s; restart the gateway to "
		       "use it)\n",
		       name, k.id, k.secret, path);
	else
		printf("user %s removed from %s (restart the gateway to refuse its key)\n", name,
		       path);
done:
	if (text)
		OPENSSL_cleanse(text, strlen(text));
	if (out)
		OPENSSL_cleanse(out, used);
	OPENSSL_cleanse(&k, sizeof(k));
	free(text);
	free(out);
	return rc;
}

/* ---- admin client: client identities (docs/security.md, "Client keys") ---- */

static const char *client_mode(uint32_t flags)
{
	return flags & STK_IDENT_SQUASH_ALL    ? "all"
	       : flags & STK_IDENT_SQUASH_ROOT ? "root"
					       : "none";
}

static int client_ls(const char *cluster, int json)
{
	struct stk_client_ident *l = NULL;
	uint32_t n = 0;
	int rc = stk_cluster_client_list(cluster, &l, &n);

	if (rc) {
		cli_err("admin", "client ls: %s", stk_strerror(rc));
		return 1;
	}
	if (json) {
		printf("[");
		for (uint32_t i = 0; i < n; i++) {
			printf("%s{\"name\": ", i ? ", " : "");
			cli_json_str(stdout, l[i].name);
			printf(", \"generation\": %llu, \"subtree\": ",
			       (unsigned long long)l[i].gen);
			cli_json_str(stdout, l[i].subtree);
			printf(", \"read_only\": %s, \"squash\": \"%s\", \"anon_uid\": %u, "
			       "\"anon_gid\": %u, \"removed\": %s}",
			       l[i].flags & STK_IDENT_READ_ONLY ? "true" : "false",
			       client_mode(l[i].flags), l[i].anon_uid, l[i].anon_gid,
			       l[i].removed ? "true" : "false");
		}
		printf("]\n");
	} else {
		printf("%-20s %5s %-10s %-6s %-13s %-8s %s\n", "NAME", "GEN", "ACCESS", "SQUASH",
		       "ANON", "STATE", "SUBTREE");
		for (uint32_t i = 0; i < n; i++) {
			char anon[32];

			snprintf(anon, sizeof(anon), "%u:%u", l[i].anon_uid, l[i].anon_gid);
			printf("%-20s %5llu %-10s %-6s %-13s %-8s %s\n", l[i].name,
			       (unsigned long long)l[i].gen,
			       l[i].flags & STK_IDENT_READ_ONLY ? "read-only" : "read-write",
			       client_mode(l[i].flags), anon, l[i].removed ? "removed" : "active",
			       l[i].subtree);
		}
	}
	free(l);
	return 0;
}

static int client_id_arg(const char *flag, const char *v, uint32_t *out)
{
	uint64_t x;

	if (stk_parse_u64(v, &x) || x > UINT32_MAX - 1) {
		cli_err("admin", "client: %s wants a number below 4294967295, not '%s'", flag, v);
		return -1;
	}
	*out = (uint32_t)x;
	return 0;
}

/*
 * `admin client add NAME [--subtree PATH] [--read-only] [--squash-root | --squash-all]
 * [--anon-uid U --anon-gid G] --key-out FILE`, `admin client rm NAME`,
 * `admin client ls [--json]`, each with [--cluster ADDR].
 */
static int client_cmd(int argc, char **argv)
{
	struct stk_client_ident c;
	const char *cluster = NULL, *key_out = NULL, *name = NULL, *verb = argc > 2 ? argv[2] : "";
	int json = 0, rc;

	memset(&c, 0, sizeof(c));
	c.anon_uid = 65534;
	c.anon_gid = 65534;
	snprintf(c.subtree, sizeof(c.subtree), "/");
	for (int i = 3; i < argc; i++) {
		if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc) {
			cluster = argv[++i];
		} else if (strcmp(argv[i], "--json") == 0) {
			json = 1;
		} else if (strcmp(argv[i], "--read-only") == 0) {
			c.flags |= STK_IDENT_READ_ONLY;
		} else if (strcmp(argv[i], "--squash-root") == 0) {
			c.flags |= STK_IDENT_SQUASH_ROOT;
		} else if (strcmp(argv[i], "--squash-all") == 0) {
			c.flags |= STK_IDENT_SQUASH_ALL;
		} else if (strcmp(argv[i], "--subtree") == 0 && i + 1 < argc) {
			if (strlen(argv[++i]) >= sizeof(c.subtree)) {
				cli_err("admin", "client: --subtree is longer than %u bytes",
					STK_IDENT_SUBTREE_MAX);
				return 1;
			}
			snprintf(c.subtree, sizeof(c.subtree), "%s", argv[i]);
			/* "/teamA/" means "/teamA" */
			for (size_t l = strlen(c.subtree); l > 1 && c.subtree[l - 1] == '/'; l--)
				c.subtree[l - 1] = 0;
		} else if (strcmp(argv[i], "--anon-uid") == 0 && i + 1 < argc) {
			if (client_id_arg("--anon-uid", argv[++i], &c.anon_uid))
				return 1;
		} else if (strcmp(argv[i], "--anon-gid") == 0 && i + 1 < argc) {
			if (client_id_arg("--anon-gid", argv[++i], &c.anon_gid))
				return 1;
		} else if (strcmp(argv[i], "--key-out") == 0 && i + 1 < argc) {
			key_out = argv[++i];
		} else if (!name && argv[i][0] != '-') {
			name = argv[i];
		} else {
			cli_err("admin", "client %s: unexpected argument '%s'", verb, argv[i]);
			return cli_usage("admin");
		}
	}
	if (strcmp(verb, "ls") == 0 && !name)
		return client_ls(cluster, json);
	if (strcmp(verb, "rm") == 0 && name) {
		uint64_t gen = 0;

		rc = stk_cluster_client_rm(cluster, name, &gen);
		if (rc == -ENOENT) {
			cli_err("admin",
				"client rm: no client named '%s' (`stoker admin client ls`)", name);
			return 1;
		}
		if (rc) {
			cli_err("admin", "client rm: %s", stk_strerror(rc));
			return 1;
		}
		printf("client %s removed (generation %llu): daemons refuse its key from now on\n",
		       name, (unsigned long long)gen);
		return 0;
	}
	if (strcmp(verb, "add") != 0 || !name) {
		cli_err("admin",
			"client add NAME [--subtree PATH] [--read-only] [--squash-root | "
			"--squash-all] [--anon-uid U --anon-gid G] --key-out FILE | client rm "
			"NAME | client ls [--json]");
		return cli_usage("admin");
	}
	if (!key_out) {
		cli_err("admin", "client add needs --key-out FILE (where its key is written)");
		return 1;
	}
	if (strlen(name) > STK_IDENT_NAME_MAX) {
		cli_err("admin", "client add: a name has at most %u characters",
			STK_IDENT_NAME_MAX);
		return 1;
	}
	snprintf(c.name, sizeof(c.name), "%s", name);
	rc = stk_cluster_client_add(cluster, &c, key_out);
	if (rc == -EEXIST) {
		cli_err("admin",
			"client add: %s exists, or a client named '%s' exists (`stoker "
			"admin client rm %s` first); nothing was changed",
			key_out, name, name);
		return 1;
	}
	if (rc == -EINVAL) {
		cli_err("admin", "client add: bad policy (see above): nothing was changed");
		return 1;
	}
	if (rc == -EPERM) {
		cli_err("admin", "client add: this process holds a client key, not the cluster "
				 "key: only the cluster key's holder issues client keys");
		return 1;
	}
	if (rc) {
		cli_err("admin", "client add: %s", stk_strerror(rc));
		return 1;
	}
	printf("client %s (generation %llu) added: key written to %s (mode 0600); use it as "
	       "STOKER_KEY_FILE or `stoker mount -o key=FILE`\n",
	       c.name, (unsigned long long)c.gen, key_out);
	return 0;
}

int cmd_admin(int argc, char **argv)
{
	const char *key = NULL;
	int rc;

	if (argc >= 2 && strcmp(argv[1], "remove-node") == 0)
		return remove_node(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "drain-node") == 0)
		return drain_node(argc, argv, 1);
	if (argc >= 2 && strcmp(argv[1], "undrain-node") == 0)
		return drain_node(argc, argv, 0);
	if (argc >= 2 && strcmp(argv[1], "accept-loss") == 0)
		return accept_loss(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "s3-user") == 0)
		return s3_user(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "client") == 0)
		return client_cmd(argc, argv);
	if (argc < 2 || strcmp(argv[1], "init") != 0)
		return cli_usage("admin");
	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--key") == 0 && i + 1 < argc) {
			key = argv[++i];
		} else {
			cli_err("admin", "unexpected argument '%s'", argv[i]);
			return cli_usage("admin");
		}
	}
	if (!key) {
		cli_err("admin", "init needs --key FILE");
		return cli_usage("admin");
	}
	rc = stk_auth_key_create(key);
	if (rc == -EEXIST) {
		cli_err("admin", "%s exists: a cluster's key is never overwritten (remove it first "
				 "if that is what you mean)",
			key);
		return 1;
	}
	if (rc) {
		cli_err("admin", "cannot create %s: %s", key, strerror(-rc));
		return 1;
	}
	printf("cluster key written to %s (mode 0600): give it to every daemon with --key-file "
	       "and to clients with --key-file or STOKER_KEY_FILE\n",
	       key);
	return 0;
}
