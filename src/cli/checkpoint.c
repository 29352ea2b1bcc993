/*
 * `stoker checkpoint resume LOCAL_DIR`: finishes the uploads of local-first
 * checkpoints that a crash interrupted. The journal and the upload live in the
 * Python package (stoker.checkpoint, docs/python.md), so this command runs it:
 * /usr/bin/python3 -m stoker.checkpoint resume LOCAL_DIR, with the package found
 * in $STOKER_PYTHONPATH, else in python/ beside this executable (the build tree).
 */
#include "cli.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/util.h"

#define CKPT_PYTHON "/usr/bin/python3"

int cmd_checkpoint(int argc, char **argv)
{
	char exe[PATH_MAX], pkg[PATH_MAX + 16], path[2 * PATH_MAX + 32];
	const char *env = getenv("STOKER_PYTHONPATH"), *old = getenv("PYTHONPATH");
	ssize_t n;

	if (argc != 3 || strcmp(argv[1], "resume") != 0)
		return cli_usage("checkpoint");
	if (env && *env) {
		if (stk_strlcpy(pkg, env, sizeof(pkg)))
			return 1;
	} else {
		n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		if (n < 0) {
			cli_err("checkpoint", "cannot find the stoker executable: %s",
				stk_strerror(-errno));
			return 1;
		}
		exe[n] = 0;
		snprintf(pkg, sizeof(pkg), "%s/python", dirname(exe));
	}
	if (old && *old)
		snprintf(path, sizeof(path), "%s:%s", pkg, old);
	else
		snprintf(path, sizeof(path), "%s", pkg);
	setenv("PYTHONPATH", path, 1);
	cli_disconnect_all();
	fflush(NULL);
	execl(CKPT_PYTHON, CKPT_PYTHON, "-m", "stoker.checkpoint", "resume", argv[2], (char *)NULL);
	cli_err("checkpoint", "cannot run %s: %s", CKPT_PYTHON, stk_strerror(-errno));
	return 1;
}
