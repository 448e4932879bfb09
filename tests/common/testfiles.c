/* Scratch folders of the file tests (testfiles.h). */
#include "testfiles.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void test_path_join(char out[TEST_PATH_CAP], const char *dir, const char *name)
{
    if (snprintf(out, TEST_PATH_CAP, "%s/%s", dir, name) >= TEST_PATH_CAP) {
        fprintf(stderr, "test set-up: path too long: %s/%s\n", dir, name);
        exit(2);
    }
}

void test_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(path);
        return;
    }
    chmod(path, 0700);
    DIR *d = opendir(path);
    if (d != NULL) {
        for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                char child[TEST_PATH_CAP];
                test_path_join(child, path, e->d_name);
                test_remove_tree(child);
            }
        }
        closedir(d);
    }
    rmdir(path);
}
