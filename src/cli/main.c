/*
 * `stoker`: one binary, a subcommand per role and per tool. The command table in
 * cli.h is the single declaration of every command: dispatch and help come from it.
 */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/util.h"

struct cli_cmd {
	const char *name;
	int (*fn)(int, char **);
	const char *usage;
	const char *what;
};

static const struct cli_cmd commands[] = {
#define STK_CLI_ENTRY(name, fn, usage, what) {#name, fn, usage, what},
	STK_CLI_COMMANDS(STK_CLI_ENTRY)
#undef STK_CLI_ENTRY
};

void cli_err(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "stoker %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

void cli_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

int cli_usage(const char *cmd)
{
	for (size_t i = 0; i < STK_ARRAY_SIZE(commands); i++)
		if (strcmp(commands[i].name, cmd) == 0)
			fprintf(stderr, "usage: stoker %s\n       %s\n", commands[i].usage,
				commands[i].what);
	return 2;
}

static void help(FILE *out)
{
	fprintf(out, "stoker %s: an all-flash parallel file system\n\n"
		     "usage: stoker COMMAND [ARGS]\n\ncommands:\n",
		STOKER_VERSION);
	for (size_t i = 0; i < STK_ARRAY_SIZE(commands); i++)
		fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].what);
	fprintf(out, "\nPaths are stk://HOST:PORT/path, or plain paths on the cluster named by\n"
		     "$STOKER_CLUSTER or, without it, the one `stoker up` started here.\n"
		     "`stoker COMMAND --help` shows a command's options.\n");
}

int cmd_version(int argc, char **argv)
{
	printf("stoker %s\n", STOKER_VERSION);
	return 0;
}

void cli_runtime_dir(char *buf, size_t len)
{
	snprintf(buf, len, "/tmp/stoker-%u", (unsigned)getuid());
}

int cli_split(const char *arg, char *cluster, size_t clen, char *path, size_t plen)
{
	const char *p = arg;

	cluster[0] = 0;
	if (strncmp(arg, "stk://", 6) == 0) {
		const char *slash = strchr(arg + 6, '/');
		size_t n = slash ? (size_t)(slash - (arg + 6)) : strlen(arg + 6);
		if (n == 0 || n >= clen)
			return -EINVAL;
		memcpy(cluster, arg + 6, n);
		cluster[n] = 0;
		p = slash ? slash : "/";
	}
	if (*p == '/') {
		if (stk_strlcpy(path, p, plen))
			return -ENAMETOOLONG;
	} else {
		if (strlen(p) + 2 > plen)
			return -ENAMETOOLONG;
		path[0] = '/';
		memcpy(path + 1, p, strlen(p) + 1);
	}
	return 0;
}

#define CLI_MAX_CLIENTS 4
static struct {
	char addr[128];
	stk_client *c;
} clients[CLI_MAX_CLIENTS];

stk_client *cli_connect(const char *cmd, const char *cluster)
{
	const char *key = cluster && *cluster ? cluster : "";
	stk_client *c;
	int rc;

	for (int i = 0; i < CLI_MAX_CLIENTS; i++)
		if (clients[i].c && strcmp(clients[i].addr, key) == 0)
			return clients[i].c;
	rc = stk_connect(*key ? key : NULL, NULL, &c);
	if (rc == -ENOENT && !*key) {
		cli_err(cmd, "no cluster given: use stk://HOST:PORT/path, set STOKER_CLUSTER, "
			     "or start one with `stoker up --data DIR --daemon`");
		return NULL;
	}
	if (rc) {
		cli_err(cmd, "cannot reach the cluster at %s: %s", *key ? key : "(default)",
			stk_strerror(rc));
		return NULL;
	}
	for (int i = 0; i < CLI_MAX_CLIENTS; i++)
		if (!clients[i].c) {
			stk_strlcpy(clients[i].addr, key, sizeof(clients[i].addr));
			clients[i].c = c;
			break;
		}
	return c;
}

void cli_disconnect_all(void)
{
	for (int i = 0; i < CLI_MAX_CLIENTS; i++) {
		stk_disconnect(clients[i].c);
		clients[i].c = NULL;
	}
}

int cli_config_args(const char *file, int *argc, char ***argv)
{
	FILE *f = fopen(file, "r");
	char line[4096];
	int n = *argc, cap = n + 64, lineno = 0;
	char **v;

	if (!f)
		return -errno;
	v = calloc((size_t)cap + 1, sizeof(*v));
	if (!v) {
		fclose(f);
		return -ENOMEM;
	}
	v[0] = (*argv)[0];
	int k = 1;
	while (fgets(line, sizeof(line), f)) {
		char *s = line, *eq, *key, *val, *e;
		lineno++;
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s == '#' || *s == '\n' || !*s)
			continue;
		eq = strchr(s, '=');
		if (!eq) {
			fprintf(stderr, "%s:%d: expected key = value\n", file, lineno);
			fclose(f);
			free(v);
			return -EINVAL;
		}
		*eq = 0;
		key = s;
		val = eq + 1;
		for (e = eq - 1; e >= key && (*e == ' ' || *e == '\t'); e--)
			*e = 0;
		while (*val == ' ' || *val == '\t')
			val++;
		e = val + strlen(val);
		while (e > val && (e[-1] == '\n' || e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
			*--e = 0;
		if (k + 2 >= cap) {
			fprintf(stderr, "%s: too many settings\n", file);
			fclose(f);
			free(v);
			return -E2BIG;
		}
		size_t kl = strlen(key);
		char *opt = malloc(kl + 3);
		if (!opt) {
			fclose(f);
			free(v);
			return -ENOMEM;
		}
		opt[0] = '-';
		opt[1] = '-';
		memcpy(opt + 2, key, kl + 1);
		v[k++] = opt;
		v[k++] = strdup(val);
	}
	fclose(f);
	/* Command-line arguments come after the file's, so they win. */
	for (int i = 1; i < n && k < cap; i++)
		v[k++] = (*argv)[i];
	v[k] = NULL;
	*argc = k;
	*argv = v;
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
	    strcmp(argv[1], "-h") == 0) {
		help(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "--version") == 0)
		return cmd_version(argc - 1, argv + 1);
	for (size_t i = 0; i < STK_ARRAY_SIZE(commands); i++) {
		if (strcmp(commands[i].name, argv[1]) == 0) {
			int rc;
			for (int j = 2; j < argc; j++)
				if (strcmp(argv[j], "--help") == 0) {
					printf("usage: stoker %s\n       %s\n", commands[i].usage,
					       commands[i].what);
					return 0;
				}
			rc = commands[i].fn(argc - 1, argv + 1);
			cli_disconnect_all();
			return rc;
		}
	}
	fprintf(stderr, "stoker: unknown command '%s'\n\n", argv[1]);
	help(stderr);
	return 2;
}
