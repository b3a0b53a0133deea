/* options_ui.c -- see options_ui.h.  One row per option, in any order. */
#include "config/options_ui.h"

#include <stddef.h>
#include <string.h>

#define BASIC "basic"
#define ADVANCED "advanced"

/* A tool: Parley's short form or OpenAI's {"type":"function","function":{...}}. */
#define TOOL_FIELDS                                                                            \
    "\"name\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z0-9_-]{1,64}$\"},"                    \
    "\"description\":{\"type\":\"string\"},"                                                   \
    "\"parameters\":{\"type\":\"object\",\"description\":\"JSON Schema of the arguments\"}"
#define TOOL_ITEMS                                                                             \
    "{\"title\":\"Tool\",\"type\":\"object\",\"anyOf\":["                                     \
    "{\"required\":[\"name\"],\"properties\":{" TOOL_FIELDS "}},"                              \
    "{\"required\":[\"type\",\"function\"],\"properties\":{\"type\":{\"const\":\"function\"}," \
    "\"function\":{\"type\":\"object\",\"required\":[\"name\"],\"properties\":{" TOOL_FIELDS    \
    "}}}}]}"

static const option_ui ROWS[] = {
    {"provider", "LLM API", BASIC, 0, NULL},
    {"base_url", "Server URL", BASIC, OPTION_UI_URI, NULL},
    {"model", "Model", BASIC, 0, NULL},
    {"api_key", "API key", BASIC, OPTION_UI_SECRET, NULL},
    {"api_key_env", "API key environment variable", ADVANCED, 0, NULL},
    {"verify_tls", "Verify TLS certificate", ADVANCED, 0, NULL},
    {"prompt", "System prompt", BASIC, 0, NULL},
    {"temperature", "Temperature", BASIC, 0, NULL},
    {"top_p", "Top P", ADVANCED, 0, NULL},
    {"max_tokens", "Maximum tokens per answer", BASIC, 0, NULL},
    {"stream", "Stream answers", BASIC, 0, NULL},
    {"connect_timeout_ms", "Connect timeout (ms)", ADVANCED, 0, NULL},
    {"request_timeout_ms", "Request timeout (ms)", ADVANCED, 0, NULL},
    {"stream_idle_timeout_ms", "Stream idle timeout (ms)", ADVANCED, 0, NULL},
    {"turn_timeout_ms", "Turn timeout (ms)", ADVANCED, 0, NULL},
    {"tool_timeout_ms", "Tool timeout (ms)", ADVANCED, 0, NULL},
    {"max_retries", "Retries", ADVANCED, 0, NULL},
    {"retry_backoff_ms", "Retry backoff (ms)", ADVANCED, 0, NULL},
    {"retry_max_delay_ms", "Longest retry delay (ms)", ADVANCED, 0, NULL},
    {"history_store", "Where history is kept", BASIC, 0, NULL},
    {"history_sync", "History durability", ADVANCED, 0, NULL},
    {"max_history_turns", "Turns of history sent", BASIC, 0, NULL},
    {"history_keep_turns", "Turns of history kept", ADVANCED, 0, NULL},
    {"context_window", "Context window (tokens)", ADVANCED, 0, NULL},
    {"context_reserve", "Tokens kept for the answer", ADVANCED, 0, NULL},
    {"summarize", "Summarize turns that leave the context", ADVANCED, 0, NULL},
    {"summary_model", "Model for summaries", ADVANCED, 0, NULL},
    {"prompt_cache_key", "Send the conversation as prompt_cache_key", ADVANCED, 0, NULL},
    {"prompt_cache_ttl_ms", "Server prompt cache lifetime (ms)", ADVANCED, 0, NULL},
    {"max_conversations", "Conversations kept", ADVANCED, 0, NULL},
    {"history_idle_timeout_s", "Forget idle conversations after (s)", ADVANCED, 0, NULL},
    {"history_key_prefix", "Redis key prefix", ADVANCED, 0, NULL},
    {"history_lease_ms", "Conversation lease across hosts (ms)", ADVANCED, 0, NULL},
    {"auto_create_conversation_id", "Create conversation ids", ADVANCED, 0, NULL},
    {"max_tool_iterations", "Tool rounds per turn", ADVANCED, 0, NULL},
    {"tools", "Tools", ADVANCED, 0, TOOL_ITEMS},
    {"tool_choice", "Tool choice", ADVANCED, 0, NULL},
    {"personas", "Personas", ADVANCED, 0, NULL},
    {"history_images", "Images kept in history", ADVANCED, 0, NULL},
    {"max_image_bytes", "Largest image (bytes)", ADVANCED, 0, NULL},
    {"max_images_per_turn", "Images per turn", ADVANCED, 0, NULL},
    {"max_in_flight", "Turns in flight", ADVANCED, 0, NULL},
    {"max_connections", "Connections to the server", ADVANCED, 0, NULL},
    {"max_input_bytes", "Largest input (bytes)", ADVANCED, 0, NULL},
    {"max_response_bytes", "Largest response (bytes)", ADVANCED, 0, NULL},
    {"max_tool_result_bytes", "Largest tool result (bytes)", ADVANCED, 0, NULL},
    {"debug_log_bodies", "Log request and response bodies", ADVANCED, 0, NULL},
    {"strip_think_tags", "Keep <think> reasoning out of answers", ADVANCED, 0, NULL},
    {"max_tokens_field", "Max tokens field (Chat Completions)", ADVANCED, 0, NULL},
    {"reasoning_effort", "Reasoning effort (Chat Completions)", ADVANCED, 0, NULL},
    {"extra_body", "Extra request fields", ADVANCED, 0, NULL},
    {"thinking_budget_tokens", "Thinking budget in tokens (Anthropic)", ADVANCED, 0, NULL},
    {"prompt_cache", "Prompt caching (Anthropic)", ADVANCED, 0, NULL},
    {"keep_alive", "Keep the model loaded for (Ollama)", ADVANCED, 0, NULL},
    {"num_ctx", "Context window in tokens (Ollama)", ADVANCED, 0, NULL},
    {"think", "Think (Ollama)", ADVANCED, 0, NULL},
};

const option_ui *option_ui_find(const char *name)
{
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++)
        if (strcmp(ROWS[i].name, name) == 0)
            return &ROWS[i];
    return NULL;
}

const char OPTION_UI_EXAMPLES[] =
    "[{\"base_url\":\"http://127.0.0.1:11434/v1\",\"model\":\"llama3.2\","
    "\"auto_create_conversation_id\":true},"
    "{\"base_url\":\"https://api.openai.com/v1\",\"model\":\"gpt-4o-mini\","
    "\"api_key_env\":\"OPENAI_API_KEY\",\"temperature\":0.5,\"stream\":true,"
    "\"tools\":[{\"name\":\"turn_on\",\"description\":\"Turn on a device.\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},"
    "\"required\":[\"name\"]}}]},"
    "{\"provider\":\"anthropic\",\"model\":\"claude-sonnet-4-5\",\"stream\":true,"
    "\"thinking_budget_tokens\":2048},"
    "{\"provider\":\"ollama\",\"model\":\"qwen3:8b\",\"num_ctx\":8192,\"keep_alive\":\"30m\","
    "\"think\":true}]";
