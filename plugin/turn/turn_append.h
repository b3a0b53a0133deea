/*
 * turn_append.h -- append_message: a message added to a conversation without
 * calling the model (an announcement).  It travels as a turn of one kind more
 * ("append"): accepted here on the host thread, queued on its conversation's
 * lane like any turn (so it lands after the turns accepted before it, never
 * inside one), and when its lane reaches it, turn_begin sends it straight to
 * turn_commit: stored as a turn of one message (its metadata and
 * interface_message_id where a model turn keeps its user message's),
 * through the same store path, with the same done callback, cancel and
 * failure rules as a model turn.
 */
#ifndef PARLEY_TURN_APPEND_H
#define PARLEY_TURN_APPEND_H

#include "engine/config.h"
#include "turn/turn.h"

/*
 * Validate message_json (append_message in plugin.h) and make it a turn with
 * request id `id` that holds a reference to `cfg`.  NULL with *status
 * (INVALID_INPUT or NO_MEMORY) and *err (malloc'd, naming the key) when it is
 * refused.  Any thread.
 */
turn *turn_append_accept(agent_config *cfg, parley_request_id id, const char *message_json,
                         parley_done_fn done, void *user_data, parley_status *status, char **err);

#endif
