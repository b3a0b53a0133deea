"""Names shared by the integration's files: the entry's and subentries' keys,
their defaults, and what a memory can belong to."""
from __future__ import annotations

DOMAIN = "parley_conversation"

# The config entry: the connection (one per LLM server).
CONF_PROVIDER = "provider"          # Parley's provider: "openai", "ollama" or "anthropic"
CONF_BASE_URL = "base_url"
CONF_API_KEY = "api_key"
CONF_PLUGIN_PATH = "plugin_path"    # where parley.so is; empty: the binding's search order
PROVIDERS = ["openai", "ollama", "anthropic"]
DEFAULT_PROVIDER = "openai"
DEFAULT_BASE_URL = {"openai": "http://127.0.0.1:8080/v1",      # llama.cpp's llama-server
                    "ollama": "http://127.0.0.1:11434",
                    "anthropic": "https://api.anthropic.com"}

# A subentry: one agent ("conversation") or one AI Task entity ("ai_task_data").
CONF_MODEL = "model"
CONF_PROMPT = "prompt"              # Home Assistant's prompt template
CONF_LLM_HASS_API = "llm_hass_api"
CONF_RECOMMENDED = "recommended"
CONF_STREAM = "stream"
CONF_TEMPERATURE = "temperature"
CONF_MAX_TOKENS = "max_tokens"
CONF_MEMORY = "memory"              # what a memory belongs to (MEMORY_* below)
CONF_MEMORY_TURNS = "memory_turns"  # Parley's max_history_turns
CONF_MEMORY_IDLE_HOURS = "memory_idle_hours"  # Parley's history_idle_timeout_s, in hours
CONF_PARLEY_OPTIONS = "parley_options"  # any other Parley option (docs/options.md), a dict

SUBENTRY_CONVERSATION = "conversation"
SUBENTRY_AI_TASK = "ai_task_data"
DEFAULT_CONVERSATION_NAME = "Parley conversation"
DEFAULT_AI_TASK_NAME = "Parley AI Task"

# What a memory belongs to.  HA's own conversation id lives until 5 idle
# minutes pass (helpers/chat_session.py); the others outlive it.
MEMORY_CONVERSATION = "conversation"   # HA's conversation: forgotten with it (HA's behaviour)
MEMORY_DEVICE = "device"               # the satellite or device spoken to
MEMORY_USER = "user"                   # the Home Assistant user
MEMORY_HOME = "home"                   # one memory for the whole home
MEMORIES = [MEMORY_CONVERSATION, MEMORY_DEVICE, MEMORY_USER, MEMORY_HOME]

RECOMMENDED_OPTIONS = {
    CONF_MEMORY: MEMORY_DEVICE,
    CONF_MEMORY_TURNS: 20,
    CONF_MEMORY_IDLE_HOURS: 24,
    CONF_STREAM: True,
}

# Per-turn input fields may be this large (Home Assistant's rendered prompt of a
# large home goes past Parley's default of 64 KiB).
MAX_INPUT_BYTES = 1 << 20

SERVICE_FORGET = "forget"
