/* fuzz_ndjson_stream.c -- Ollama's NDJSON chat stream; see fuzz_provider_stream.h. */
#define FUZZ_PROVIDER "ollama"
#include "fuzz_provider_stream.h"
