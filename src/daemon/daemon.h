/*
 * What every daemon shares: signal handling and the stop request.
 *
 * stk_daemon_init() installs SIGINT/SIGTERM handlers (and ignores SIGPIPE); when
 * one arrives, the server registered with stk_daemon_set_server() is told to stop
 * (stk_server_stop is async-signal-safe) and stk_daemon_stopping() turns true, so
 * background threads (heartbeats, flushers) finish their loop and exit.
 */
#ifndef STK_DAEMON_DAEMON_H
#define STK_DAEMON_DAEMON_H

struct stk_server;

void stk_daemon_init(const char *role);
void stk_daemon_set_server(struct stk_server *s);
int stk_daemon_stopping(void);
/* Asks the daemon to stop, as a signal would. */
void stk_daemon_request_stop(void);
/* Sleeps up to ms milliseconds, returning early (1) if a stop was requested. */
int stk_daemon_sleep_ms(unsigned ms);

#endif
