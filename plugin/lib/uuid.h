/* uuid.h -- random (version 4) UUIDs from getrandom(), for turn and conversation ids. */
#ifndef PARLEY_UUID_H
#define PARLEY_UUID_H

#define UUID_STR_LEN 37 /* 36 characters + NUL */

/* Write "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx" into out; 0, or -1 if no randomness. */
int uuid4(char out[UUID_STR_LEN]);

/* 1 when s is a UUID in that form: 36 characters, hex digits (either case) and four '-'. */
int uuid_valid(const char *s);

#endif
