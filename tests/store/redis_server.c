/* redis_server.c -- see redis_server.h. */
#include "redis_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int accepts_connections(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static double slowdown(void)
{
    const char *s = getenv("PARLEY_TEST_SLOWDOWN");
    double f = s ? atof(s) : 1.0;
    return f >= 1.0 ? f : 1.0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int spawn(redis_server *r)
{
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a crashed test leaves no server behind */
        int saved_stderr = dup(2);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) { /* nor a pipe held open for whoever reads the test's output */
            dup2(devnull, 1);
            dup2(devnull, 2);
            close(devnull);
        }
        const char *argv[16] = {"redis-server", "--port", port, "--bind", "127.0.0.1",
                                "--save", "", "--appendonly", "no", "--dir", r->dir};
        int n = 11;
        if (r->password[0]) {
            argv[n++] = "--requirepass";
            argv[n++] = r->password;
        }
        argv[n] = NULL;
        execvp("redis-server", (char *const *)argv);
        dprintf(saved_stderr, "redis_server: cannot run redis-server (%s): run scripts/setup.sh\n",
                strerror(errno));
        _exit(127);
    }
    r->pid = pid;
    long waited = 0, limit = (long)(10000 * slowdown());
    while (!accepts_connections(r->port)) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid || waited > limit) {
            fprintf(stderr, "redis_server: redis-server did not start on port %d\n", r->port);
            if (waited > limit)
                kill(pid, SIGKILL), waitpid(pid, &status, 0);
            r->pid = 0;
            return -1;
        }
        sleep_ms(10);
        waited += 10;
    }
    return 0;
}

int redis_server_start(redis_server *r, const char *password)
{
    memset(r, 0, sizeof *r);
    snprintf(r->password, sizeof r->password, "%s", password ? password : "");
    snprintf(r->dir, sizeof r->dir, "/tmp/parley-redis-XXXXXX");
    if (!mkdtemp(r->dir)) {
        perror("redis_server: mkdtemp");
        return -1;
    }
    for (int attempt = 0; attempt < 5; attempt++) { /* the free port may be taken meanwhile */
        r->port = free_port();
        if (r->port > 0 && spawn(r) == 0)
            return 0;
    }
    return -1;
}

int redis_server_restart(redis_server *r)
{
    for (int attempt = 0; attempt < 50; attempt++) { /* the port may linger a moment */
        if (spawn(r) == 0)
            return 0;
        sleep_ms(100);
    }
    return -1;
}

static void end(redis_server *r, int sig)
{
    if (r->pid > 0) {
        kill(r->pid, sig);
        waitpid(r->pid, NULL, 0);
    }
    r->pid = 0;
}

void redis_server_kill(redis_server *r)
{
    end(r, SIGKILL);
}

void redis_server_stop(redis_server *r)
{
    end(r, SIGTERM);
    if (r->dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "redis_server: could not remove %s\n", r->dir);
        r->dir[0] = '\0';
    }
}

void redis_server_url(const redis_server *r, char *buf, size_t size)
{
    if (r->password[0])
        snprintf(buf, size, "redis://:%s@127.0.0.1:%d", r->password, r->port);
    else
        snprintf(buf, size, "redis://127.0.0.1:%d", r->port);
}
