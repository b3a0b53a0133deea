/* test_http_outcome.c -- what a finished transfer's curl code means for the turn
 * (http_call_outcome): libcurl running out of memory, or Parley keeping the answer,
 * is no_memory, wherever the response was, never a bad answer or a connection failure. */
#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "http/llm_http.h"

static parley_status outcome_of(size_t header_bytes, size_t received, CURLcode code, int body_oom)
{
    http_call c;
    memset(&c, 0, sizeof c);
    c.body.oom = body_oom;
    c.easy = curl_easy_init();
    c.header_bytes = header_bytes;
    c.received = received;
    c.display_url = "http://127.0.0.1:9/v1/chat/completions";
    char *msg = NULL;
    int retryable = -1;
    parley_status st = http_call_outcome(&c, code, &msg, &retryable);
    CHECK(retryable == 0 || st != PARLEY_ERR_NO_MEMORY);
    CHECK(msg != NULL);
    free(msg);
    curl_easy_cleanup(c.easy);
    return st;
}

static parley_status outcome(size_t header_bytes, size_t received, CURLcode code)
{
    return outcome_of(header_bytes, received, code, 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    /* before the response, after its headers, in its body */
    CHECK(outcome(0, 0, CURLE_OUT_OF_MEMORY) == PARLEY_ERR_NO_MEMORY);
    CHECK(outcome(120, 0, CURLE_OUT_OF_MEMORY) == PARLEY_ERR_NO_MEMORY);
    CHECK(outcome(120, 40, CURLE_OUT_OF_MEMORY) == PARLEY_ERR_NO_MEMORY);
    /* the answer's buffer could not grow: on_body refused it, libcurl calls it a write error */
    CHECK(outcome_of(120, 40, CURLE_WRITE_ERROR, 1) == PARLEY_ERR_NO_MEMORY);
    /* the neighbours keep their meaning */
    CHECK(outcome(0, 0, CURLE_COULDNT_CONNECT) == PARLEY_ERR_CONNECT);
    CHECK(outcome(120, 40, CURLE_RECV_ERROR) == PARLEY_ERR_BAD_RESPONSE);
    curl_global_cleanup();
    return check_report();
}
