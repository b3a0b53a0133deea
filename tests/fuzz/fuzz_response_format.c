/*
 * fuzz_response_format.c -- a host's response_format_json and a model's answer,
 * both arbitrary: the input is the format's text, a newline, then the answer's.
 * Parsing the format must give a format or a clear error; checking the answer
 * against its schema must say yes or why not; never a crash, a leak, or a
 * recursion without bound (a $ref cycle, deep nesting).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/response_format.h"
#include "lib/json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char *answer = strchr(text, '\n');
    if (answer)
        *answer++ = '\0';

    char *err = NULL;
    response_format *rf = NULL;
    parley_status st = response_format_parse(text, &rf, &err);
    if (!rf == !err || (st == PARLEY_OK) != !!rf)
        abort(); /* exactly one of a format and an error */
    free(err);
    json_t *v = answer ? json_loads(answer, JSON_DECODE_ANY, NULL) : NULL;
    if (rf && rf->schema && v) {
        err = NULL;
        parley_status rc = json_schema_validate(rf->schema, v, &err);
        if ((rc == PARLEY_OK) != !err)
            abort(); /* a mismatch always says why, a match never does */
        free(err);
    }
    json_decref(v);
    response_format_free(rf);
    free(text);
    return 0;
}
