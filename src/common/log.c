/*
 * Logging: format into a stack buffer, one write(2) per line so that lines from
 * different threads never interleave.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static const char *g_role = "stoker";
static enum stk_log_level g_level = STK_LOG_INFO;
static int g_level_init;

void stk_log_set_role(const char *role)
{
	g_role = role;
}

void stk_log_set_level(enum stk_log_level level)
{
	g_level = level;
	g_level_init = 1;
}

void stk_log(enum stk_log_level level, const char *fmt, ...)
{
	static const char *names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
	char line[1024];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n, m;

	if (!g_level_init) {
		const char *e = getenv("STOKER_LOG");
		if (e && strcasecmp(e, "debug") == 0)
			g_level = STK_LOG_DEBUG;
		g_level_init = 1;
	}
	if (level < g_level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s [%s] ",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		     ts.tv_nsec / 1000000, names[level], g_role);
	va_start(ap, fmt);
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	n += m;
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* nowhere left to report a failed log write */
	}
}
