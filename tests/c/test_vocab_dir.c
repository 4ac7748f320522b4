/* test_vocab_dir.c - every vocab that has llama.cpp's test vectors beside
 * it, in the shared vocab folder and in $TL_VOCAB_DIR (more vocabs than
 * the named tests know: drop a NAME.gguf with NAME.gguf.inp/.out in and it
 * is checked). A vocab whose tokenizer model tinyloop does not run must be
 * refused with a message naming the model, never crash or mis-tokenize. */
#include <dirent.h>
#include <stdint.h>

#include "gguf.h"
#include "test.h"
#include "tokenizer.h"
#include "tokenizer_impl.h"
#include "util.h"

#include "tok_util.h"
#include "vocab_check.h"

static int n_checked, n_refused;

static void check_one(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    gguf_file *f = gguf_open(path);
    if (!f) return; /* vectors without their vocab: nothing to run */
    tl_tokenizer *t = tl_tokenizer_load(f);
    if (!t) {
        /* refused: it must say which model it cannot run */
        CHECK(strstr(tl_last_error(), "unsupported tokenizer model '"), "%s is refused naming its model (%s)", name,
              tl_last_error());
        n_refused++;
    } else {
        int n = check_vocab_file(path, name, t, NULL);
        if (n >= 0) { /* (an .inp without its .out: nothing to run) */
            CHECK(n > 0, "%s: its test strings were read (%d)", name, n);
            n_checked++;
        }
    }
    tl_tokenizer_free(t);
    gguf_close(f);
}

static void check_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        printf("skip: %s unreadable\n", dir);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n > 9 && !strcmp(e->d_name + n - 9, ".gguf.inp")) {
            char name[512];
            snprintf(name, sizeof name, "%.*s", (int)(n - 4), e->d_name);
            check_one(dir, name);
        }
    }
    closedir(d);
}

int main(void) {
    const char *shared = test_shared_dir();
    if (shared) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/vocab", shared);
        check_dir(dir);
    }
    const char *extra = getenv("TL_VOCAB_DIR");
    if (extra && *extra) check_dir(extra);
    printf("vocabs with test vectors: %d checked, %d refused as unsupported\n", n_checked, n_refused);
    CHECK(!shared || n_checked >= 1, "the shared vocab folder's vocabs were found (%d)", n_checked);
    return test_summary();
}
