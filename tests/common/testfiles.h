/* Scratch folders of the file tests (test_npy, test_safetensors). */
#ifndef FXA_TESTFILES_H
#define FXA_TESTFILES_H

#define TEST_PATH_CAP 4096

/* out = dir "/" name; a path longer than TEST_PATH_CAP ends the test (exit 2). */
void test_path_join(char out[TEST_PATH_CAP], const char *dir, const char *name);

/* Remove path and everything below it (making folders writable first). */
void test_remove_tree(const char *path);

#endif
