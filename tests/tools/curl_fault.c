/*
 * curl_fault.c -- an LD_PRELOAD library for the integration tests: the Nth
 * curl_multi_add_handle (N = $PARLEY_FAULT_MULTI_ADD, counted from 1) answers
 * CURLM_OUT_OF_MEMORY, as libcurl short of memory does; every other call goes
 * through.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <curl/curl.h>
#include <dlfcn.h>
#include <stdlib.h>

typedef CURLMcode (*multi_add_fn)(CURLM *, CURL *);

CURLMcode curl_multi_add_handle(CURLM *multi, CURL *easy)
{
    static int adds;
    /* libcurl came in with parley.so, RTLD_LOCAL: not in RTLD_NEXT's scope */
    void *curl = dlopen("libcurl.so.4", RTLD_LAZY | RTLD_NOLOAD);
    multi_add_fn real = curl ? (multi_add_fn)dlsym(curl, "curl_multi_add_handle") : NULL;
    if (curl)
        dlclose(curl);
    const char *nth = getenv("PARLEY_FAULT_MULTI_ADD");
    if (!real || (nth && __atomic_add_fetch(&adds, 1, __ATOMIC_SEQ_CST) == atoi(nth)))
        return CURLM_OUT_OF_MEMORY;
    return real(multi, easy);
}
