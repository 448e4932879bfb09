/* A small JSON checker for the CLI's --stats, --json and check --json
 * output: one whole object, and the values of its fields by key. */
#ifndef FXA_CLI_JSON_H
#define FXA_CLI_JSON_H

#include <stddef.h>

/* text is one JSON object on one line, ending with a newline. On failure
 * *where is the offset of the first offending character. */
int json_one_object_line(const char *text, size_t *where);
/* Value text right after "key": (spaces skipped), or NULL. */
const char *json_field(const char *text, const char *key);
/* The value of key is a JSON number (followed by ',', '}' or ' '). */
int json_is_number(const char *text, const char *key);
/* The value of key reads as the number want. */
int json_number_is(const char *text, const char *key, double want);
/* The value of key reads as a number above 0. */
int json_positive(const char *text, const char *key);
/* The value of key is the string want. */
int json_string_is(const char *text, const char *key, const char *want);

#endif
