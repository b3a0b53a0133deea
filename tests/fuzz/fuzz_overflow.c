/*
 * fuzz_overflow.c -- llm_overflow_parse on any error body and status.
 *
 * Server error bodies are untrusted: no crash, no leak, sizes never
 * negative, nothing left in *out when the body is not an overflow, and the
 * answer does not depend on the status beyond "a 4xx".
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "provider/overflow.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    llm_overflow o, again;
    int found = llm_overflow_parse(400, (const char *)data, size, &o);
    FUZZ_CHECK(o.n_prompt >= 0 && o.n_ctx >= 0);
    if (!found)
        FUZZ_CHECK(o.n_prompt == 0 && o.n_ctx == 0);
    FUZZ_CHECK(llm_overflow_parse(413, (const char *)data, size, &again) == found);
    FUZZ_CHECK(memcmp(&o, &again, sizeof o) == 0);
    FUZZ_CHECK(llm_overflow_parse(500, (const char *)data, size, &again) == 0);
    FUZZ_CHECK(again.n_prompt == 0 && again.n_ctx == 0);
    return 0;
}
