/*
 * `stoker admin`: cluster administration. `admin init --key FILE` makes a cluster
 * key (docs/security.md): 32 random bytes as hex, mode 0600, never over an existing
 * file. Give it to every daemon with --key-file FILE and to clients with
 * --key-file / $STOKER_KEY_FILE (`stoker up` makes DATA/cluster.key itself).
 */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../common/auth.h"

int cmd_admin(int argc, char **argv)
{
	const char *key = NULL;
	int rc;

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
