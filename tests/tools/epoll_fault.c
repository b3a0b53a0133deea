/*
 * epoll_fault.c -- an LD_PRELOAD library for the integration tests: the Nth
 * EPOLL_CTL_ADD of a socket (N = $PARLEY_FAULT_EPOLL_ADD, counted from 1)
 * fails with ENOMEM, as the kernel may; every other epoll_ctl goes through.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/stat.h>

typedef int (*epoll_ctl_fn)(int, int, int, struct epoll_event *);

int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
    static int socket_adds;
    epoll_ctl_fn real = (epoll_ctl_fn)dlsym(RTLD_NEXT, "epoll_ctl");
    const char *nth = getenv("PARLEY_FAULT_EPOLL_ADD");
    struct stat st;
    if (nth && op == EPOLL_CTL_ADD && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) &&
        __atomic_add_fetch(&socket_adds, 1, __ATOMIC_SEQ_CST) == atoi(nth)) {
        errno = ENOMEM;
        return -1;
    }
    return real(epfd, op, fd, ev);
}
