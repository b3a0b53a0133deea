/* test_reply_context.c -- reply_context_load (reply_context.c) on the memory store:
 * a turn older than the window comes back whole ("included"), one inside it does not
 * ("in_window"), an unknown one or another conversation's is "not_found"; the store
 * door refuses a backend table of another version or without a required method. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/reply_context.h"

static const char *const TURN_IDS[] = {
    "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222",
    "33333333-3333-4333-8333-333333333333", "44444444-4444-4444-8444-444444444444"};
static const char *const MESSAGE_IDS[][2] = {
    {"a1111111-1111-4111-8111-111111111111", "b1111111-1111-4111-8111-111111111111"},
    {"a2222222-2222-4222-8222-222222222222", "b2222222-2222-4222-8222-222222222222"},
    {"a3333333-3333-4333-8333-333333333333", "b3333333-3333-4333-8333-333333333333"},
    {"a4444444-4444-4444-8444-444444444444", "b4444444-4444-4444-8444-444444444444"}};

/* Turn i of conversation `id`: "q<i>" and "a<i>", the question carrying interface id "m<i>". */
static void append_turn(store *s, const char *id, int i)
{
    char q[64], a[64], imid[8];
    snprintf(q, sizeof q, "{\"role\":\"user\",\"content\":\"q%d\"}", i);
    snprintf(a, sizeof a, "{\"role\":\"assistant\",\"content\":\"a%d\"}", i);
    snprintf(imid, sizeof imid, "m%d", i);
    store_message msgs[2] = {
        {.message_id = MESSAGE_IDS[i][0], .role = "user", .created_ms = 10, .json = q,
         .json_len = strlen(q), .interface_message_id = imid},
        {.message_id = MESSAGE_IDS[i][1], .role = "assistant", .created_ms = 11, .json = a,
         .json_len = strlen(a)}};
    store_turn t = {.turn_id = TURN_IDS[i], .started_ms = 10, .finished_ms = 11,
                    .messages = msgs, .nmessages = 2};
    store_key key = {id, "", ""};
    CHECK(store_append(s, &key, &t, 20, NULL) == PARLEY_OK);
}

static reply_outcome load(store *s, const char *id, const char *turn_id, const char *imid,
                          size_t window, reply_context *rc)
{
    char json[128];
    if (turn_id)
        snprintf(json, sizeof json, "{\"turn_id\":\"%s\"}", turn_id);
    else
        snprintf(json, sizeof json, "{\"interface_message_id\":\"%s\"}", imid);
    char *err = NULL;
    CHECK(reply_context_parse(json, rc, &err) == PARLEY_OK);
    store_key key = {id, "", ""};
    CHECK(reply_context_load(s, &key, window, 30, rc, &err) == PARLEY_OK);
    CHECK(err == NULL);
    free(err);
    return rc->outcome;
}

int main(void)
{
    store_config cfg = {.location = "", .limits = {0, 100, 0}};
    store *s = NULL;
    char *err = NULL;
    CHECK(store_open(&store_memory_backend, &cfg, &s, &err) == PARLEY_OK);
    if (!s)
        return check_report();
    for (int i = 0; i < 3; i++)
        append_turn(s, "home", i);
    append_turn(s, "other", 3);

    reply_context rc;
    /* the oldest of three, with a window of two: sent again, whole */
    CHECK(load(s, "home", TURN_IDS[0], NULL, 2, &rc) == REPLY_INCLUDED);
    CHECK_STR(rc.messages.data, "{\"role\":\"user\",\"content\":\"q0\"},"
                                "{\"role\":\"assistant\",\"content\":\"a0\"},");
    CHECK(rc.nmessages == 2);
    CHECK_STR(rc.found_turn_id, TURN_IDS[0]);
    reply_context_free(&rc);
    /* by the interface id of its user message */
    CHECK(load(s, "home", NULL, "m0", 2, &rc) == REPLY_INCLUDED);
    CHECK_STR(rc.found_turn_id, TURN_IDS[0]);
    reply_context_free(&rc);
    /* inside the window (or a window of everything): nothing to send twice */
    CHECK(load(s, "home", TURN_IDS[1], NULL, 2, &rc) == REPLY_IN_WINDOW);
    CHECK(rc.messages.len == 0 && rc.nmessages == 0);
    reply_context_free(&rc);
    CHECK(load(s, "home", TURN_IDS[0], NULL, 0, &rc) == REPLY_IN_WINDOW);
    reply_context_free(&rc);
    /* unknown, or another conversation's turn */
    CHECK(load(s, "home", "00000000-0000-4000-8000-000000000000", NULL, 1, &rc) ==
          REPLY_NOT_FOUND);
    CHECK(rc.messages.len == 0);
    reply_context_free(&rc);
    CHECK(load(s, "home", TURN_IDS[3], NULL, 1, &rc) == REPLY_NOT_FOUND);
    reply_context_free(&rc);
    CHECK(load(s, "home", NULL, "m3", 1, &rc) == REPLY_NOT_FOUND);
    reply_context_free(&rc);
    CHECK(load(s, "nobody", TURN_IDS[0], NULL, 1, &rc) == REPLY_NOT_FOUND);
    reply_context_free(&rc);

    /* the result moves from a store job's context to the turn's */
    reply_context job, turn_rc;
    CHECK(load(s, "home", TURN_IDS[0], NULL, 1, &job) == REPLY_INCLUDED);
    CHECK(reply_context_copy_target(&turn_rc, &job) == 0);
    reply_context_take_result(&turn_rc, &job);
    CHECK(turn_rc.outcome == REPLY_INCLUDED && turn_rc.nmessages == 2);
    CHECK(turn_rc.messages.len > 0 && job.messages.len == 0);
    reply_context_free(&job);
    reply_context_free(&turn_rc);

    /* the door refuses a table of another version, or one without a required
     * method, once at open: no caller meets a missing load_turn */
    store_backend old = store_memory_backend;
    old.version = 3;
    store *refused = NULL;
    CHECK(store_open(&old, &cfg, &refused, &err) == PARLEY_ERR_STORAGE && !refused);
    CHECK(err && strstr(err, "memory store backend: built for another version"));
    free(err);
    err = NULL;
    old.version = STORE_BACKEND_VERSION;
    old.load_turn = NULL;
    CHECK(store_open(&old, &cfg, &refused, &err) == PARLEY_ERR_STORAGE && !refused);
    CHECK(err && strstr(err, "no load_turn method"));
    free(err);
    err = NULL;
    old = store_memory_backend;
    old.lease_acquire = NULL;
    old.lease_release = NULL;
    CHECK(store_open(&old, &cfg, &refused, &err) == PARLEY_OK && refused);
    CHECK(!store_shared(refused));
    store_close(refused);

    store_close(s);
    return check_report();
}
