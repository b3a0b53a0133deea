/*
 * codec.h -- helpers the provider codecs share (not for the turn), in codec.c.
 *
 * Each API's codec is in files of its own (openai.c, openai_reply.c and
 * openai_stream.c; anthropic.c; ollama.c); what they have in common is here,
 * so every provider words its errors alike and fills an llm_reply the same way.
 */
#ifndef PARLEY_PROVIDER_CODEC_H
#define PARLEY_PROVIDER_CODEC_H

#include <curl/curl.h>
#include <jansson.h>

#include "lib/buf.h"
#include "provider/llm_reply.h"
#include "config/options.h"

const char *llm_json_type_name(const json_t *v);       /* "an object", "a string", "missing" */
char *llm_clean_text(const char *text, size_t n);      /* server text made safe to show */
char *llm_arguments_text(const json_t *obj);           /* an arguments object as JSON text */
/* Fill a call: empty id -> "call_<pos>", NULL/empty arguments -> "{}". */
int llm_fill_call(llm_tool_call *c, size_t pos, const char *id, const char *name,
                  const char *arguments, char **err);
/* The same with the arguments gathered in a buffer (its length says whether it is empty). */
int codec_fill_call(llm_tool_call *c, size_t pos, const char *id, const char *name,
                    const pbuf *args, char **err);
/* *err = "the answer has more than LLM_MAX_TOOL_CALLS tool calls"; -1. */
int llm_too_many_calls(char **err);
/* Move text into out->content: "" without tool calls, NULL beside them when empty. */
int llm_set_content(llm_reply *out, pbuf *text, char **err);

/* ---- rendering neutral messages ---- */

/* Member `key` as a string, or NULL. */
const char *msg_str(const json_t *msg, const char *key);
/* The message's role, or "" */
const char *msg_role(const json_t *msg);
/* The text of a content that is a string or text parts (malloc'd; "" for null). */
char *msg_text(const json_t *content);
/* The URL of an image content part {"type":"image_url","image_url":{"url"}}, else NULL. */
const char *msg_image_url(const json_t *part);
/* A tool call's arguments (a JSON string or, from Ollama-era records, an object) as an object:
   invalid JSON or a non-object becomes {"invalid_json": text}.  New reference. */
json_t *msg_arguments_object(const json_t *call);
/* The same as JSON text (malloc'd). */
char *msg_arguments_text(const json_t *call);
/* A copy of this turn's messages whose first user message carries the turn note
   (provider_request.turn_note) after its text: "\n\n" and the note appended to a string
   content, a text part "\n\n<note>" appended to parts.  New reference; NULL out of memory. */
json_t *msgs_with_turn_note(const json_t *messages, const char *note);
/*
 * System notes: a system message in the history (append_message with role "system") goes to
 * the model as user text where it happened, "[system note] <text>", never as a system message
 * after the first: strict chat templates refuse one (Qwen 3.x: "System message must be at the
 * beginning", ggml-org/llama.cpp#20733, #27367) and others want user and assistant to alternate
 * (Gemma, Mistral: "Conversation roles must alternate user/assistant/user/assistant/...").  A
 * run of notes (joined by "\n\n") opens the user message after it, else is a user message of
 * its own.  Each depends only on the stored messages, so a stored note renders the same bytes
 * on every later request and the server's prefix cache keeps matching.
 */
#define SYSTEM_NOTE_PREFIX "[system note] "
/* Append the note of system message m to the run in notes ("\n\n" between notes). */
void notes_add(pbuf *notes, const json_t *m);
/* A copy of user message m opening with the notes: "<notes>\n\n<text>" for a string content,
   a text part "<notes>\n\n" first for parts.  New reference; NULL out of memory. */
json_t *msg_user_with_notes(const json_t *m, const char *notes);
/* The notes as a user message of their own.  New reference; NULL out of memory. */
json_t *msg_notes_alone(const char *notes);
/* A copy of all with every run of system messages rendered so (msgs_alternate starts here).
   *first_current (in and out): where this turn starts; a run that opens the turn's user message
   belongs to the turn.  New reference; NULL out of memory. */
json_t *msgs_merge_notes(const json_t *all, size_t *first_current);
/*
 * Alternation: after the system message user and assistant take turns, the user first, as
 * strict chat templates want (Gemma: "Conversation roles must alternate ..."); a tool round
 * keeps its shape, the assistant's calls then their results.  Two user messages in a row (an
 * appended one, or a run of notes after a user message), or two assistant messages without
 * calls in a row (an appended announcement after a reply), go as one, joined by msg_join; a
 * history that opens with an assistant message gets CONVERSATION_START, a user message, first.
 * Joining changes how the earlier message renders once the later one is stored: the one
 * request after that re-reads the model's cache from the join on (docs/history.md).
 */
#define CONVERSATION_START "(start of the conversation)"
/* What joins m with a message of the same kind: 'u' user, 'a' assistant without tool calls;
   else 'c' assistant with calls, 't' tool, 's' system, 0 another role. */
int msg_join_kind(const json_t *m);
#ifdef PARLEY_TEST_HOOKS
/* A copy of a whose content is a's then b's, "\n\n" between them (none if one is empty);
   parts if either is parts, a text part "\n\n" between.  New reference; NULL out of memory.
   The join's definition, which the tests hold msgs_join to; the plugin joins runs with it. */
json_t *msg_join(const json_t *a, const json_t *b);
#endif
/* The messages of run (two or more) joined as msg_join joins them one after another, left
   to right, in time linear in their size: a run of hundreds of appended group-chat messages
   joined pairwise copies the growing text each time.  New reference; NULL out of memory. */
json_t *msgs_join(const json_t *run);
/* {"role":"user","content":CONVERSATION_START}.  New reference. */
json_t *msg_conversation_start(void);
/* msgs_merge_notes, then alternation as above (the Ollama codec's).  *first_current as
   msgs_merge_notes's: a turn's user message joined to the one before belongs to the turn.
   New reference; NULL out of memory. */
json_t *msgs_alternate(const json_t *all, size_t *first_current);
/* History then this turn's messages in one new array; *first_current = where this turn starts. */
json_t *msgs_concat(const json_t *history, const json_t *messages, size_t *first_current);
/* The tool name of the tool result all[index]: its own "name", else the name of the call with
   its tool_call_id in the assistant message before it; "" if none. */
const char *msg_tool_name(const json_t *all, size_t index);
/*
 * A history an older Parley stored may hold one tool-call id twice in an assistant message
 * (before llm_reply_claim_ids made them unique in a turn): servers refuse to see it again
 * ("Duplicate tool call id", "tool_use ids must be unique").  A render sends the second and
 * later calls with that id as "<id>_<k>" (k = 2, 3, ...; further bumped while taken in the
 * message) and the tool results after them, in order, the same; the stored text is unchanged.
 */
typedef struct call_renames {
    json_t *queues; /* id -> the ids to send for its results, in order; NULL: none pending */
    json_t *handed; /* the id call_renames_result last gave (alive until the next call) */
} call_renames;
/* An assistant message's tool_calls: a new array of the ids to send when one repeats (the
   renames then wait for the results), else NULL.  Any earlier renames are dropped. */
json_t *call_renames_assign(call_renames *r, const json_t *calls);
/* The id to send for a tool result answering `id`. */
const char *call_renames_result(call_renames *r, const char *id);
void call_renames_free(call_renames *r);

/* provider_data.<provider>.<key> of a message, or NULL. */
const json_t *msg_provider_data(const json_t *msg, const char *name, const char *key);

/* Dump a JSON value compactly onto b (order preserved). */
void pbuf_json(pbuf *b, const json_t *v);

/* Parley's parts of a request body every codec renders alike. */
void render_extra_body(pbuf *b, const parley_options *o); /* ",k:v" per extra_body key */
/* Render a body built with jansson (stolen) into out, extra_body merged.  0 or -1 (OOM,
   also when a codec_set/codec_append since codec_build_begin failed). */
int codec_body_text(pbuf *out, json_t *body, const parley_options *o, char **err);

/* Building a body with jansson.  Its setters fail quietly out of memory (the member is
 * left out; a constructor's NULL, its out of memory, is a failed set too), and a request
 * missing a message or its system prompt must not be sent.  An encoder that builds its
 * body with these, between codec_build_begin and codec_body_text, has any failure counted
 * once at the end, as pbuf's oom (per thread: the encoders run on many). */
void codec_build_begin(void);
void codec_set(json_t *obj, const char *key, json_t *value);   /* steals value */
void codec_append(json_t *array, json_t *value);               /* steals value */
void codec_extend(json_t *array, json_t *other);               /* other is borrowed */
void codec_insert(json_t *array, size_t index, json_t *value); /* steals value */
void codec_build_oom(void); /* a piece of the body (a text) could not be made */
/* msg_text for the body: NULL (out of memory) counted as codec_build_oom. */
char *codec_text(const json_t *content);
/* "Authorization: Bearer <api_key>" when there is a key.  0 or -1 (OOM). */
int codec_bearer_header(const parley_options *o, struct curl_slist **list);

/* The window to assume of a server that did not say (OpenAI's default_window, and
   Ollama's without num_ctx): 128000 without a base_url (the default) or for OpenAI's own API, else
   4096 (a local server: llama.cpp's long-standing default). */
long long codec_default_window(const parley_options *o);

/* ---- small shared pieces of the decoders ---- */

/* *err = the formatted message (NULL if even that allocation fails; err may be NULL); -1. */
int codec_fail(char **err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int codec_oom(char **err);                               /* *err = "out of memory"; -1 */
long long codec_count(const json_t *obj, const char *key); /* a token count; 0 if absent */
/* Member `key` of obj; a null member is missing too (NULL). */
const json_t *codec_member(const json_t *obj, const char *key);
/* *out = the string member `key`, or NULL when missing or null; any other type is the
   error "<what> <key> is <type>, not a string".  0 or -1. */
int codec_optional_string(const json_t *obj, const char *key, const char *what,
                          const char **out, char **err);
/* *err = "<what> is not JSON: <why> (at byte <n>)"; -1. */
int codec_fail_not_json(char **err, const char *what, const json_error_t *jerr);
/* A body that is the server's {"error": {...}} (or [{"error": ...}]) instead of an answer:
   *err = LLM_SERVER_ERROR, its message, then its type and code when it has them; -1. */
int codec_fail_server_error(const json_t *root, char **err);

/* A stream decoder's life: once it failed, every later call repeats its error. */
typedef struct codec_stream_state {
    int failed, finished;
    char *error;
} codec_stream_state;
/* Fail for good with msg (owned; NULL = out of memory); *err gets a copy (err may be NULL).
   Returns -1. */
int codec_stream_die(codec_stream_state *st, char *msg, char **err);
/* -1 with *err when the stream already failed (its error again) or finished ("stream fed
   after it finished", "stream already finished"); else 0, and with finishing it now is. */
int codec_stream_dead(codec_stream_state *st, int finishing, char **err);

#endif
