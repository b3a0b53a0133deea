/* fuzz_anthropic_stream.c -- Anthropic Messages SSE events; see fuzz_provider_stream.h. */
#define FUZZ_PROVIDER "anthropic"
#include "fuzz_provider_stream.h"
