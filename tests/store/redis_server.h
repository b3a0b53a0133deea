/*
 * redis_server.h -- a real redis-server for tests: started on a free
 * loopback port in a temporary directory, with no persistence, and stopped
 * (or killed, and started again on the same port) by the test.
 */
#ifndef PARLEY_TEST_REDIS_SERVER_H
#define PARLEY_TEST_REDIS_SERVER_H

#include <sys/types.h>

typedef struct redis_server {
    pid_t pid;               /* 0 when not running */
    int port;
    char dir[64];            /* the temporary working directory */
    char password[64];       /* "" = none */
} redis_server;

/* Start redis-server on a free port (password may be NULL).  0, or -1 with a
 * message on stderr (redis-server missing: run scripts/setup.sh). */
int redis_server_start(redis_server *r, const char *password);

/* Start it again on the same port and password after a stop or kill. */
int redis_server_restart(redis_server *r);

/* SIGKILL: the server vanishes as in a crash (the directory stays). */
void redis_server_kill(redis_server *r);

/* Stop it and remove its directory. */
void redis_server_stop(redis_server *r);

/* "redis://[:PASSWORD@]127.0.0.1:PORT" into buf. */
void redis_server_url(const redis_server *r, char *buf, size_t size);

#endif
