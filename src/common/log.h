/*
 * Logging for every Stoker process.
 *
 * One line per event on stderr: "2026-12-02T15:10:00.123Z LEVEL [role] message".
 * Daemons started by `stoker up` have stderr redirected to DIR/log/ROLE.log, so
 * these lines are what an operator reads after a failure. Safe from any thread:
 * each line is formatted into a local buffer and written with one write(2).
 */
#ifndef STK_LOG_H
#define STK_LOG_H

enum stk_log_level { STK_LOG_DEBUG = 0, STK_LOG_INFO, STK_LOG_WARN, STK_LOG_ERROR };

/* Sets the role tag printed in every line (e.g. "meta"); the string must outlive the process. */
void stk_log_set_role(const char *role);
/* Lines below this level are dropped. Default INFO; STOKER_LOG=debug lowers it. */
void stk_log_set_level(enum stk_log_level level);
void stk_log(enum stk_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define stk_debug(...) stk_log(STK_LOG_DEBUG, __VA_ARGS__)
#define stk_info(...) stk_log(STK_LOG_INFO, __VA_ARGS__)
#define stk_warn(...) stk_log(STK_LOG_WARN, __VA_ARGS__)
#define stk_error(...) stk_log(STK_LOG_ERROR, __VA_ARGS__)

#endif
