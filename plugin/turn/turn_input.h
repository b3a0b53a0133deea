/* turn_input.h -- accept a host's input as a new turn (see turn_input.c). */
#ifndef PARLEY_TURN_INPUT_H
#define PARLEY_TURN_INPUT_H

#include "engine/config.h"
#include "turn/turn.h"

/*
 * Validate and copy `in` (any thread) into a new turn with request id `id`,
 * holding a reference to `cfg` until it is freed.  NULL with *status
 * (INVALID_INPUT or NO_MEMORY) and *err (malloc'd, naming the field) when
 * the input is refused.
 */
turn *turn_input_accept(agent_config *cfg, parley_request_id id, const parley_input *in,
                        parley_done_fn done, void *user_data, parley_status *status, char **err);

#endif
