/* worker.h -- what turn.c needs from the worker that runs it. */
#ifndef PARLEY_WORKER_H
#define PARLEY_WORKER_H

#include "turn.h"

/* The turn is about to call back: it is no longer live (cancel finds it no more). */
void worker_forget(turn *t);
/* The turn has called back: start the next turn of its conversation, free it. */
void worker_release(turn *t);

#endif
