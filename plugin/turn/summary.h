/*
 * summary.h -- the summary a turn makes after its commit, off the answer's
 * path: when turns left the context window (this turn's cut, or earlier ones
 * no summary has folded in yet), the model is asked for the summary so far
 * plus those turns; when the window nears its limit, for the summary made
 * ahead of the next cut, as the conversation's own request plus an
 * instruction (so the server reads all but the instruction from its cache).
 * The summary goes into the window's record (context/window.h), stored for the
 * conversation's next turn.
 *
 * The state machine (turn.c) decides when: it reports the turn to the host,
 * enters SUMMARIZING and sends the request these functions render, then
 * SUMMARY_SAVING to store the record they write.  A summary that fails is
 * counted and logged, never an error: the turn was reported ok, its turns
 * are kept and folded in later.
 */
#ifndef PARLEY_TURN_SUMMARY_H
#define PARLEY_TURN_SUMMARY_H

#include <curl/curl.h>
#include <stddef.h>

#include "store/store.h"
#include "turn/turn.h"

/* After the commit: whether a summary is due, and if so its request rendered
   into t->req.body.  1 ready; 0 none (a request that could not be rendered is
   logged and counted as a failed summary). */
int summary_render(turn *t);

/* The summary's request ended (`code`): its answer written into the window's
   record, and the record that answer replaces copied into *expected
   (malloc'd, *expected_len bytes): the record is stored only if no other
   host's turn has written one since.  0: the record is ready to store; -1:
   there is none, and the turn has ended (summary_end). */
int summary_take(turn *t, CURLcode code, char **expected, size_t *expected_len);

/* Store the record under `key`: on the store threads (t->job; its outcome
   comes back through turn_on_committed to summary_saved) or now.  Takes
   `expected`. */
void summary_save(turn *t, const store_key *key, char *expected, size_t expected_len);

/* The store took the record (PARLEY_OK) or refused it: the turn ends. */
void summary_saved(turn *t, parley_status status, const char *message);

/* The summary is done (made, failed or given up): the turn ends as it was
   reported, ok. */
void summary_end(turn *t, int made, const char *why);

#endif
