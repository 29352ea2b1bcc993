/*
 * The dashboard's files (src/mgmtd/ui/), embedded into the binary at build time:
 * the Makefile turns each into a byte array with `xxd -i` (scripts/embed-ui.sh),
 * so that mgmtd serves the page with no file to install and no network to reach.
 */
#ifndef STK_MGMTD_UI_ASSETS_H
#define STK_MGMTD_UI_ASSETS_H

#include <stddef.h>

struct stk_ui_asset {
	const char *name; /* the file's name in src/mgmtd/ui/ ("index.html") */
	const unsigned char *data;
	size_t len;
};

/* Every file, then an entry whose name is NULL. Static: valid for the process's life. */
extern const struct stk_ui_asset stk_ui_assets[];

#endif
